import sys, re, collections
cur=None; t=collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith('## '): cur=line[3:].strip(); continue
    m=re.match(r'round \d+ \S+ b\d+ (\S+): (.*)', line)
    if m:
        for k,v in re.findall(r'(\d+)K ([\d.]+)', m.group(2)): t[(cur,k,m.group(1))].append(float(v))
for c,k in sorted({(c,k) for c,k,_ in t}, key=lambda x:(x[0],int(x[1]))):
    a=sorted(t[(c,k,'shapes')]); b=sorted(t[(c,k,'auto')])
    if a and b: print(f"{c:28s} {k:>4s}K shapes {a[len(a)//2]:7.1f} hint {b[len(b)//2]:7.1f} {100*(b[len(b)//2]/a[len(a)//2]-1):+5.1f}%")
