"""The attention anchors of bench_torch.py (`attn_cases`, unchanged) for chosen shapes only,
so that a device call has time for our sweep too. Usage: anchor_attn.py B,T,HQ,H,D ..."""
import sys
import time

sys.path.insert(0, ".carry")
import bench_torch  # noqa: E402

print("B,T,HQ,H,D,case,ms", flush=True)
for arg in sys.argv[1:]:
    case = tuple(int(x) for x in arg.split(","))
    t0 = time.time()
    for name, ms in bench_torch.attn_cases(*case).items():
        print(",".join(str(x) for x in case) + f",{name},{ms:.3f}", flush=True)
    print(f"# case took {time.time() - t0:.0f}s", flush=True)
