"""Sandboxed SQL throughput against bare sqlite3, and task-generation throughput.

    python bench/sql_env.py [--num-queries 1000] [--repeats 5]

The queries are the gold queries of the built-in training tasks. The baseline runs each one on a plain
per-thread ``sqlite3`` connection (``execute`` + ``fetchall``); the sandbox runs the same query through
``envs.sql.execute`` (read-only connection, authorizer, deadline, row and character caps). Both keep one
connection per thread and database and are warmed up first. Target: sandbox time / bare time <= 1.5.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from envs.sql import execute
from envs.sql.generator import generate_sql_tasks

_bare = threading.local()


def bare_execute(db_path: str, sql: str) -> list[tuple]:
    connections = getattr(_bare, "connections", None)
    if connections is None:
        connections = _bare.connections = {}
    conn = connections.get(db_path)
    if conn is None:
        conn = connections[db_path] = sqlite3.connect(db_path, check_same_thread=False)
    return conn.execute(sql).fetchall()


def sandbox_execute(db_path: str, sql: str) -> list[tuple]:
    return execute(db_path, sql).rows


def queries_per_second(runs: dict, queries: list[tuple[str, str]], num_threads: int, repeats: int) -> dict:
    """Best queries/s of each runner; the runners alternate so machine load hits them alike."""
    best = dict.fromkeys(runs, float("inf"))
    paths, sqls = [q[0] for q in queries], [q[1] for q in queries]
    with ThreadPoolExecutor(max_workers=num_threads) as pool:
        for run in runs.values():
            list(pool.map(run, paths, sqls))  # warm-up: open connections, fill statement caches
        for _ in range(repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                list(pool.map(run, paths, sqls))
                best[name] = min(best[name], time.perf_counter() - start)
    return {name: len(queries) / seconds for name, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-queries", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as db_dir:
        start = time.perf_counter()
        tasks = generate_sql_tasks(seed=0, db_dir=db_dir)
        cold_s = time.perf_counter() - start
        start = time.perf_counter()
        generate_sql_tasks(seed=0, db_dir=db_dir)
        warm_s = time.perf_counter() - start
        num_tasks = len(tasks["train"]) + len(tasks["test"])
        rows = list(zip(tasks["train"]["db_path"], tasks["train"]["gold_sql"], strict=True))
        queries = random.Random(0).sample(rows, min(args.num_queries, len(rows)))
        assert all(sandbox_execute(*q) == bare_execute(*q) for q in queries), (
            "sandbox and bare results differ"
        )

        results = []
        print(f"{'threads':>7} {'bare q/s':>10} {'sandbox q/s':>12} {'overhead':>9}")
        for num_threads in (1, 4):
            qps = queries_per_second(
                {"bare": bare_execute, "sandbox": sandbox_execute}, queries, num_threads, args.repeats
            )
            bare, sandbox = qps["bare"], qps["sandbox"]
            overhead = bare / sandbox
            results.append(
                {
                    "threads": num_threads,
                    "bare_qps": round(bare),
                    "sandbox_qps": round(sandbox),
                    "overhead": round(overhead, 3),
                }
            )
            print(f"{num_threads:>7} {bare:>10.0f} {sandbox:>12.0f} {overhead:>8.2f}x")
    print(
        f"task generation: {num_tasks} tasks in {cold_s:.2f}s cold ({num_tasks / cold_s:.0f} tasks/s), "
        f"{warm_s:.2f}s with databases reused ({num_tasks / warm_s:.0f} tasks/s)"
    )
    print(
        json.dumps(
            {
                "bench": "sql_env",
                "queries": len(queries),
                "results": results,
                "max_overhead": max(r["overhead"] for r in results),
                "target_overhead": 1.5,
                "tasks": num_tasks,
                "generation_cold_s": round(cold_s, 3),
                "generation_warm_s": round(warm_s, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
