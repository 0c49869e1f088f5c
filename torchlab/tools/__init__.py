"""The tools around training: doctor (check the container), bench (+ bench_data: measure the pipelines),
autotune (pick loader settings), sample_data (a small ImageFolder to try things on)."""
