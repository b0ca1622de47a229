import sys,re
for f in sys.argv[1:]:
    print("##",f)
    head=None
    for line in open(f):
        if line.startswith("== rep"):
            head=line.split()[3:]
        elif re.match(r"^[A-Z][A-Za-z0-9.-]+ +\d+ +\d+ \|",line) and head:
            a=line.split("|")
            l=a[1].split(); s=a[2].split()
            print(f"{head[0]:>2} {head[1]:<24} {' '.join(head[2:5]):<22} {' '.join(head[5:]):<18} locks {l[1]} x{l[2]} | score {s[0]} agg {s[1]} sel {s[2]} attn {s[3]} launch {s[4]}")
        elif "terminate" in line or "what()" in line:
            print("   ERR", line.strip()[:120])
