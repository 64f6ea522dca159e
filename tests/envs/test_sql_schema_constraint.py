"""envs.sql.schema_constraint: the schema constraint on SQL replies, checked against what SQLite says of each
query."""

import copy
import pickle
import random
import sqlite3

import pytest

from envs.sql.multi_turn import SqlMultiTurnEnv
from envs.sql.schema_constraint import SQL_TAGS, SchemaNames, schema_names
from envs.sql.single_turn import SqlEnv

LEAD = "```sql\nSELECT"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("names") / "school.sqlite"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE teachers (LastName TEXT, FirstName TEXT, Classroom INTEGER);
        CREATE TABLE list (LastName TEXT, FirstName TEXT, Grade INTEGER, Classroom INTEGER);
        CREATE TABLE "Course Info" (cid INTEGER PRIMARY KEY, title TEXT, credits INTEGER);
        INSERT INTO teachers VALUES ('Ames', 'Ann', 105), ('Bell', 'Bo', 106);
        INSERT INTO list VALUES ('Cole', 'Cy', 4, 105), ('Dunn', 'Di', 5, 106);
        """
    )
    con.commit()
    con.close()
    return str(path)


def sqlite_error(db, sql):
    """SQLite's own verdict on a query: None when it runs, else its error message."""
    con = sqlite3.connect(db)
    try:
        con.execute(sql).fetchall()
        return None
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        con.close()


def accepted_at_every_character(rule, reply):
    """Whether the constraint lets the reply be written one character at a time, then closed."""
    text = reply + "\n```"
    return all(rule.accepts(text[:i], i - 1) for i in range(1, len(text) + 1))


VALID = [
    "SELECT grade FROM list WHERE classroom  =  105",
    "SELECT T1.lastname FROM teachers AS T1 JOIN list AS T2 ON T1.classroom = T2.classroom WHERE T2.grade>4",
    "SELECT count(*) FROM list WHERE classroom IN (SELECT classroom FROM teachers WHERE firstname LIKE 'a%')",
    "SELECT grade ,  count(*) AS n FROM list GROUP BY grade ORDER BY n DESC LIMIT 1",
    "SELECT firstname FROM teachers EXCEPT SELECT firstname FROM list",
    "SELECT COUNT (DISTINCT grade) FROM list",
    "SELECT avg(t.grade) FROM (SELECT grade FROM list) AS t",
    "SELECT lastname FROM teachers WHERE lastname  =  'no such column here'",
    "SELECT title FROM `Course Info` WHERE credits  >  2",
    "SELECT list.grade FROM list",
    "SELECT lastname ,  grade FROM list JOIN teachers USING (lastname)",
]

WRONG_NAMES = [
    "SELECT grade FROM teachers",  # a column of another table
    "SELECT grad FROM list",  # a column of no table
    "SELECT T1.grade FROM teachers AS T1",  # an alias whose table lacks the column
    "SELECT lastname FROM teacher",  # no such table
    "SELECT T1.lastname FROM teachers AS T1 JOIN list AS T2 ON T1.classroom  =  T2.room",
    "SELECT firstname FROM teachers WHERE grade  =  1",
    "SELECT count(*) FROM list WHERE classroom IN (SELECT room FROM teachers)",
]


@pytest.mark.parametrize("sql", VALID)
def test_a_query_sqlite_runs_is_accepted_at_every_character(db, sql):
    assert sqlite_error(db, sql) is None
    rule = SchemaNames(schema_names(db), LEAD)
    assert accepted_at_every_character(rule, sql[len("SELECT") :])


@pytest.mark.parametrize("sql", WRONG_NAMES)
def test_a_query_sqlite_refuses_for_a_name_is_refused(db, sql):
    assert "no such" in sqlite_error(db, sql)
    rule = SchemaNames(schema_names(db), LEAD)
    assert not accepted_at_every_character(rule, sql[len("SELECT") :])


def test_a_name_is_refused_as_soon_as_no_name_of_the_schema_starts_so(db):
    rule = SchemaNames(schema_names(db), LEAD)
    assert rule.accepts(" gra", 3)  # grade
    assert not rule.accepts(" grz", 3)
    assert rule.accepts(" T1", 2)  # an alias FROM may still define
    assert rule.accepts(" grade FROM li", 13)  # list holds grade
    assert not rule.accepts(" grade FROM te", 13)  # teachers does not: steered before the name is whole
    assert rule.accepts(" lastname FROM list WHERE gra", 28)
    assert not rule.accepts(" lastname FROM teachers WHERE gra", 32)  # not a column of the query's tables


def test_a_single_table_query_goes_to_the_table_that_holds_all_its_columns(db):
    rule = SchemaNames(schema_names(db), LEAD)
    # teachers holds lastname but not grade; list holds both
    assert not rule.accepts(" lastname ,  grade FROM teachers ", 32)
    assert rule.accepts(" lastname ,  grade FROM list ", 28)
    # the price of steering: a join that names the table holding them all second must start from it
    sql = "SELECT lastname ,  grade FROM teachers JOIN list USING (lastname)"
    assert sqlite_error(db, sql) is None
    assert not accepted_at_every_character(rule, sql[len("SELECT") :])


def test_only_the_newest_text_is_judged(db):
    """A violation the engine let through once is not charged again to the tokens after it."""
    rule = SchemaNames(schema_names(db), LEAD)
    assert not rule.accepts(" grz ,", 4)  # the space after it makes grz whole
    assert rule.accepts(" grz ,", 5)
    assert rule.accepts(" grz ,  grade", 12)
    assert not rule.accepts(" grz ,  grz ", 11)


def test_strings_are_not_names_and_padding_is_refused(db):
    rule = SchemaNames(schema_names(db), LEAD)
    assert rule.accepts(" lastname FROM list WHERE firstname  =  'Grz Q'", 45)
    assert rule.accepts(' lastname FROM list WHERE firstname  =  "Grz Q"', 45)
    assert not rule.accepts(" lastname     ", 13)
    assert not rule.accepts(" lastname # note", 11)
    assert rule.accepts(" lastname  ", 10)


def test_a_reply_is_judged_inside_its_sql_fence_only(db):
    rule = SchemaNames(schema_names(db), "")
    assert rule.accepts("Here grz is prose", 6)
    assert not rule.accepts("```sql\nSELECT grz ", 17)
    assert rule.accepts("```sql\nSELECT grade FROM list\n```\nand grz after it", 45)
    assert rule.accepts("```sql\nWITH x AS (SELECT 1) SELECT grz FROM x", 41)  # WITH is not checked


def written_at_every_character(rule, text):
    return all(rule.accepts(text[:i], i - 1) for i in range(1, len(text) + 1))


@pytest.mark.parametrize("sql", VALID)
def test_the_multi_turn_tags_hold_queries_sqlite_runs(db, sql):
    rule = SchemaNames(schema_names(db), "", SQL_TAGS)
    assert written_at_every_character(rule, f"Let me look first. <sql>{sql}</sql>")
    assert written_at_every_character(rule, f"<answer>\n{sql}\n</answer>")


@pytest.mark.parametrize("sql", WRONG_NAMES)
def test_the_multi_turn_tags_refuse_queries_sqlite_refuses_for_a_name(db, sql):
    rule = SchemaNames(schema_names(db), "", SQL_TAGS)
    assert not written_at_every_character(rule, f"<sql>{sql}</sql>")
    assert not written_at_every_character(rule, f"<ANSWER>{sql}</ANSWER>")


def test_a_tagged_query_is_judged_up_to_its_closing_tag_and_only_when_it_is_a_select(db):
    rule = SchemaNames(schema_names(db), "", SQL_TAGS)
    assert not rule.accepts("<sql>SELECT grz ", 15)
    assert rule.accepts("<sql>SELECT grade FROM list WHERE grade <", 40)  # "<" may compare or close
    assert rule.accepts("<sql>SELECT grade FROM list </ans", 31)  # the closing tag, half written
    assert not rule.accepts("<sql>SELECT grade FROM list </ans>", 33)  # not a closing tag after all
    assert rule.accepts("<sql>SELECT grade FROM list</sql> then grz", 40)  # after the block: prose
    assert rule.accepts("<sql>PRAGMA table_info(list)</sql>", 20)  # exploring without SELECT: unchecked
    assert rule.accepts("<sql>sel", 7) and not rule.accepts("<sql>select grz ", 15)


def test_the_sql_env_puts_the_constraint_on_its_episodes_only_when_asked(db):
    task = {"question": "Which grades?", "db_path": db, "gold_sql": "SELECT grade FROM list"}
    assert SqlEnv(response_prefix=LEAD).start(task).constraint is None
    episode = SqlEnv(response_prefix=LEAD, constrain_names=True).start(task)
    sent = pickle.loads(pickle.dumps(episode.constraint))  # as a rollout-worker process receives it
    for rule in (episode.constraint, sent):
        assert rule.accepts(" grade FROM list\n```", 19)
        assert not rule.accepts(" grade FROM teachers\n```", 23)


def test_the_multi_turn_env_constrains_every_turn_and_the_prefix_only_on_the_first(db):
    task = {"question": "Which grades?", "db_path": db, "gold_sql": "SELECT grade FROM list"}
    assert SqlMultiTurnEnv().start(task).constraint is None
    episode = SqlMultiTurnEnv(constrain_names=True, response_prefix="<sql>SELECT").start(task)
    first = pickle.loads(pickle.dumps(episode.constraint))
    assert first.accepts(" grade FROM list</sql>", 21) and not first.accepts(" grz ", 4)
    episode.step("<sql>SELECT grade FROM list</sql>")  # an exploring turn: the episode goes on
    later = episode.constraint
    assert later.accepts("<answer>SELECT grade FROM list</answer>", 38)
    assert not later.accepts("<answer>SELECT grade FROM teachers</answer>", 42)
    assert later.accepts("The grades are known now.", 24)  # prose: the reply holds no query


GROWN = [
    *VALID,
    *WRONG_NAMES,
    "SELECT grade FROM list WHERE grade > 1e+5 OR grade < .5e-3",
    "SELECT lastname FROM teachers WHERE lastname = 'O''Neil' AND firstname != ''",
    "SELECT count (*) ,  max (grade) FROM list",
    'SELECT "lastname" ,  [grade] FROM list WHERE `classroom` = 1',
    "SELECT T2.grade FROM list AS T2 WHERE T2.grade IN (SELECT grade FROM list AS T3 WHERE T3.grz = 1)",
    "SELECT grade FROM list    WHERE grade = 1",
    "SELECT max grade FROM list",  # a function's name without its "(": wrong where the next word ends
]


def test_a_reply_read_on_from_its_earlier_texts_gets_the_verdicts_a_fresh_reading_gives(db):
    """The engine asks one constraint about a reply's text again and again as it grows, and about each
    candidate that may follow it: each verdict equals that of a constraint reading the text for the first
    time (copy.copy keeps nothing read), for replies grown in chunks of 1-6 characters with every other
    reply's next chunk tried beside the true one."""
    rng = random.Random(0)
    rule = SchemaNames(schema_names(db), LEAD)
    for reply in GROWN:
        text, cut = reply[len("SELECT") :] + "\n```", 0
        while cut < len(text):
            step = rng.randint(1, 6)
            tries = [text[cut : cut + step]] + [
                other[len("SELECT") :][cut : cut + rng.randint(1, 6)] for other in rng.sample(GROWN, 6)
            ]
            for extra in tries:
                candidate = text[:cut] + extra
                fresh = copy.copy(rule).accepts(candidate, cut)
                assert rule.accepts(candidate, cut) == fresh, (candidate, cut)
            cut += step
