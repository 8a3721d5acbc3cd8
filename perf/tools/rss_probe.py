"""Resident memory during the statistics pass: sampled after every chunk.

Run: PYTHONPATH=. python perf/tools/rss_probe.py 30000 > results/calibration/rss_probe_30k.json
Streaming accumulation means the RSS after chunk 1 and after chunk N are the same (up to
allocator noise); ``ru_maxrss`` of the whole process is dominated by the model load.
"""

import json
import os
import resource
import sys
import time

import torch

from oscar_kernels.calibration import pipeline
from oscar_kernels.calibration.capture import check_supported
from oscar_kernels.calibration.data import calibration_and_heldout_ids, load_model


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    tokens = int(sys.argv[1])
    torch.set_num_threads(2)
    model, tok = load_model()
    geo = check_supported(model)
    ids, _ = calibration_and_heldout_ids(tok)
    samples = []
    original = pipeline.LayerStats.update

    def update(self, *a, **kw):
        original(self, *a, **kw)
        if self is stats_ref[-1]:
            samples.append({"tokens": self.num_tokens, "rss_mib": round(rss_mib(), 1)})

    stats_ref = []
    orig_init = pipeline.LayerStats.__init__

    def init(self, *a, **kw):
        orig_init(self, *a, **kw)
        stats_ref.append(self)

    pipeline.LayerStats.__init__ = init
    pipeline.LayerStats.update = update
    t0 = time.time()
    pipeline.collect_statistics(model, geo, ids, max_tokens=tokens, chunk_len=1024,
                                progress=False)
    json.dump({"tokens": tokens, "seconds": round(time.time() - t0, 1),
               "rss_after_each_chunk": samples,
               "ru_maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
              sys.stdout, indent=1)


if __name__ == "__main__":
    main()
