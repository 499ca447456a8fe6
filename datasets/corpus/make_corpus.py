"""Rebuild the shipped corpus files (kjv.txt.gz, tokenizer.json) from the Debian package.

Provenance and licence: see README.md in this folder. Run once by the maintainers; learners never need it
(labkit.data builds the token file from the two shipped files). Steps, all deterministic:

    apt-get download bible-kjv bible-kjv-text && for f in *.deb; do dpkg-deb -x $f root; done
    root/usr/bin/bible -p root/usr/lib -f gen1:1-rev22:21 > kjv_raw.txt     # one verse per line
    python datasets/corpus/make_corpus.py kjv_raw.txt

Documents are chapters (1,189 of them); a document is "<book> <chapter>" on its first line and one
verse per line ("<n> <text>"); documents are separated by one blank line in kjv.txt.gz.
The tokenizer is a byte-level BPE (GPT-2 style pre-tokenisation) trained on the corpus with the
`tokenizers` library, vocabulary 4096, special token <|endoftext|> = id 0 (the document separator).
"""
from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VOCAB = 4096
EOS = "<|endoftext|>"


def chapters(raw_lines):
    """Group "Ge1:1 In the beginning..." lines into chapter documents."""
    docs, key, verses = [], None, []
    for line in raw_lines:
        m = re.match(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$", line.rstrip("\n"))
        if not m:
            continue
        book, ch, verse, text = m.groups()
        if (book, ch) != key:
            if verses:
                docs.append(f"{key[0]} {key[1]}\n" + "\n".join(verses))
            key, verses = (book, ch), []
        verses.append(f"{verse} {text.strip()}")
    if verses:
        docs.append(f"{key[0]} {key[1]}\n" + "\n".join(verses))
    return docs


def main(raw_path: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs = chapters(Path(raw_path).read_text(encoding="utf-8", errors="replace").splitlines())
    text = "\n\n".join(docs) + "\n"
    # mtime=0 → byte-identical output on every rebuild
    with open(HERE / "kjv.txt.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                               compresslevel=9, filename="") as f:
        f.write(text.encode("utf-8"))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    tok.save(str(HERE / "tokenizer.json"))
    print(f"{len(docs)} documents, {len(text):,} characters, vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main(sys.argv[1])
