"""Commands over the core: doctor (check the container), bench (+ bench_data, bench_gil: measure the pipelines and
the GIL), autotune (pick loader settings), gpu_check (what --decode gpu gives), prepare (write a prepared copy), env
(export the environment, diff it against a run's record), sample_data (a small ImageFolder to try things on)."""
