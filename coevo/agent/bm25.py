"""Okapi BM25 (Robertson & Zaragoza 2009) over short texts: what skill activation
(coevo/agent/skills.py) and per-task demo retrieval (coevo/agent/demos.py) rank by.

The usual k1 = 1.5, b = 0.75 and the Lucene-style idf `log(1 + (N - df + 0.5) / (df + 0.5))`,
which stays positive for terms found in most documents (the original idf goes negative there,
which would make a small collection rank a document *down* for matching the query).
Departure: the tokenizer splits snake_case and camelCase identifiers into words (a function
named `unit_conversion` matches "convert units" through "unit"); no stemming beyond a plural
"s". The package rank-bm25 (or bm25s) would do the same ranking; this one file keeps the
tokenizer that identifier-heavy texts (function names, tool calls) need.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

_WORD = re.compile(r"[A-Za-z][a-z]*|[A-Z]+(?![a-z])|\d+")
_STOP = frozenset(
    "a an and are as at be by for from has have how i in is it its of on or that the this to "
    "use used using was what when which with you your".split())


def tokenize(text: str) -> list[str]:
    """Lower-case words, identifiers split, stop words dropped, a plural "s" trimmed.

    >>> tokenize("getWeatherForecast for unit_conversions")
    ['get', 'weather', 'forecast', 'unit', 'conversion']
    """
    out = []
    for word in _WORD.findall(text):
        w = word.lower()
        if w in _STOP:
            continue
        if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return out


class BM25:
    """Okapi BM25 over a fixed list of documents.

    >>> bm = BM25(["compute the area of a triangle", "convert temperature units"])
    >>> [round(s, 3) for s in bm.scores("triangle area")]
    [1.386, 0.0]
    """

    def __init__(self, documents: Sequence[str], k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self.docs = [Counter(tokenize(d)) for d in documents]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.avg_len = (sum(self.lengths) / len(self.docs)) if self.docs else 0.0
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        n = len(self.docs)
        self.idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> list[float]:
        terms = tokenize(query)
        out = []
        for doc, length in zip(self.docs, self.lengths):
            norm = self.k1 * (1 - self.b + self.b * length / self.avg_len) if self.avg_len else 0
            s = 0.0
            for t in terms:  # a repeated query term counts again, as in Lucene
                tf = doc.get(t, 0)
                if tf:
                    s += self.idf[t] * tf * (self.k1 + 1) / (tf + norm)
            out.append(s)
        return out
