"""The host the project runs on, as the engine, its kernels, the trainer, the job, the environments and the
benchmarks all see it: the process's C library and /proc/cpuinfo (system), torch's CPU thread pool sized to
the cores other processes leave free (cpu_threads), and the cache directory of what is built once."""
