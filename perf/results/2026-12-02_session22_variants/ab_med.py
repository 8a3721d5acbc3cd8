import sys, re, collections
t = collections.defaultdict(list); order = []; vorder = []
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) < 3 or line.startswith('#'):
        continue
    v = parts[0]
    if v not in vorder: vorder.append(v)
    for k, x in re.findall(r'(\S+/b\d+/\d+K) ([\d.]+)', line):
        t[(k, v)].append(float(x))
        if k not in order: order.append(k)
vs = vorder
for k in order:
    meds = [sorted(t[(k, v)])[len(t[(k, v)]) // 2] if t[(k, v)] else float('nan') for v in vs]
    print(f"{k:22s} " + "  ".join(f"{v} {m:7.1f}" for v, m in zip(vs, meds)) + f"  {100 * (meds[-1] / meds[0] - 1):+5.1f}%  (rounds: " + " | ".join(",".join(f"{x:.1f}" for x in t[(k, v)]) for v in vs) + ")")
