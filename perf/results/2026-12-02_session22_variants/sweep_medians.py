import re,sys,collections
d=collections.defaultdict(list)
for line in open(sys.argv[1]):
    m=re.match(r'^(w11 )?round \d+ (\S+) b(\d+) (\S+): (.*)$',line.strip())
    if not m: continue
    pre,model,b,plan,rest=m.groups()
    for ctx,t in re.findall(r'(\d+K) ([\d.]+)',rest):
        d[(model,int(b),ctx,(pre or '')+plan)].append(float(t))
rows=collections.defaultdict(dict)
for (model,b,ctx,plan),v in d.items():
    v=sorted(v); rows[(model,b,ctx)][plan]=v[len(v)//2]
for k in sorted(rows):
    print(k[0],k[1],k[2],"  ".join(f"{p} {t:.1f}" for p,t in rows[k].items()))
