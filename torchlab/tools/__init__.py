"""Commands over the core: doctor (check the container), bench (+ bench_data: measure the pipelines), autotune
(pick loader settings), gpu_check (what --decode gpu gives), prepare (write a prepared copy), sample_data (a small
ImageFolder to try things on)."""
