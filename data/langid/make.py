"""Builds train.tsv and test.tsv (label<TAB>text) from Debian's fortune packages.

Run where the packages' files are unpacked under ROOT (e.g. `apt-get download fortunes-min fortunes-de fortunes-it
fortunes-es fortunes-br; for f in *.deb; do dpkg -x $f ROOT; done`): python3 make.py ROOT
"""
import random
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]) / "usr/share/games"
# label, language, the fortune files (relative to ROOT)
LANGUAGES = [
    (0, "en", ["fortunes/fortunes", "fortunes/literature", "fortunes/riddles"]),
    (1, "de", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fortunes/de").iterdir() if p.is_file() and p.suffix != ".dat")),
    (2, "it", ["fortunes/italia", "fortunes/definizioni", "fortunes/leggi", "fortunes/formiche", "fortunes/computer"]),
    (3, "es", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fortunes/es").iterdir() if p.is_file() and p.suffix != ".dat")),
    (4, "pt", ["fortunes/brasil"]),
]
TRAIN, TEST, LONGEST = 500, 150, 240


def cookies(path):
    text = (ROOT / path).read_bytes().decode("utf-8", errors="replace")
    for c in text.split("\n%\n"):
        c = " ".join(c.replace("\t", " ").split())
        if 20 <= len(c) <= LONGEST and "\ufffd" not in c:
            yield c


rng = random.Random(0)
train, test = [], []
for label, lang, files in LANGUAGES:
    pool = sorted({c for f in files for c in cookies(f)})
    rng.shuffle(pool)
    if len(pool) < TRAIN + TEST:
        sys.exit(f"{lang}: only {len(pool)} cookies")
    train += [(label, c) for c in pool[:TRAIN]]
    test += [(label, c) for c in pool[TRAIN:TRAIN + TEST]]
rng.shuffle(train)
rng.shuffle(test)
for name, rows in [("train.tsv", train), ("test.tsv", test)]:
    Path(name).write_text("".join(f"{l}\t{c}\n" for l, c in rows), encoding="utf-8")
    print(name, len(rows))
