# Which instructions consume a global load's result soon after it issues (a prefetch whose
# value is consumed near its load waits for it there). For one kernel instance of a cubin:
# for every LDG, the first later instruction (linear order, up to a branch or a redefinition)
# reading its destination; prints the counts of (distance // 10 * 10, load, consumer) under 40.
#   python3 load_uses.py FILE.cubin INSTANCE_SUBSTRING   (cuobjdump on PATH)
# e.g. load_uses.py super_score.cubin ILi8ELi4ELi1ELi1E (Llama's level 1: RM 8, NW 4, PL 1,
# extent mode). The scan is linear, so it mixes the paths a kernel takes at run time (the
# byte-wise loads of non-aligned layouts, the prologue): read it per load kind.
import re
import subprocess
import sys
from collections import Counter

cubin, inst = sys.argv[1], sys.argv[2]
sass = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
body = [f for f in re.split(r"\n\s+Function : ", sass) if inst in f.split("\n")[0]][0]
ins = [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", body)]


def opcode(s):
    return [t for t in s.split() if not t.startswith("@")][0]


def regs(s):
    return set(re.findall(r"\bR(\d+)\b", s))


near, total = [], 0
for i, s in enumerate(ins):
    o = opcode(s)
    if not o.startswith("LDG"):
        continue
    total += 1
    base = int(re.findall(r"\bR(\d+)\b", s.split(o, 1)[1].split(",")[0])[0])
    width = 4 if ".128" in o else 2 if ".64" in o else 1
    dst = {str(base + k) for k in range(width)}
    for j in range(i + 1, min(i + 400, len(ins))):
        t = ins[j]
        to = opcode(t)
        parts = t.split(to, 1)[1].split(",")
        store = to.startswith(("ST", "RED", "ATOM"))
        if regs(",".join(parts if store else parts[1:])) & dst:
            near.append((j - i, o, to))
            break
        if to.startswith(("BRA", "EXIT", "RET")) or (not store and regs(parts[0]) & dst):
            break
print(inst, "global loads", total, "instructions", len(ins))
for k, n in sorted(Counter((d // 10 * 10, o, to) for d, o, to in near if d < 40).items()):
    print(k, n)
