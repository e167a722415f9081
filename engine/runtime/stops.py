"""Incremental stop-string matching: one KMP automaton per stop string.

Sequence.append feeds each token's new text; the cost is O(new characters x stop strings)
amortized, independent of how long the output already is (re-searching the whole text every
token let one request with many stop strings stall the engine thread for every other request).
The automaton state of a stop string is the length of its longest prefix that ends the text so
far: the largest state is how much text must be held back (it may be the start of a match).
"""
from __future__ import annotations


def _failure(s: str) -> list[int]:
    """KMP failure function: f[i] = length of the longest proper prefix of s[:i+1] that is also its suffix."""
    f = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = f[k - 1]
        if s[i] == s[k]:
            k += 1
        f[i] = k
    return f


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = list(dict.fromkeys(s for s in stops if s))  # unique, non-empty, in order
        self.fail = [_failure(s) for s in self.stops]
        self.state = [0] * len(self.stops)

    def feed(self, new: str) -> tuple[int | None, int]:
        """Advance over `new`. Returns (back, hold): back = characters from the start of the earliest
        match to the end of the stream (None: no match), hold = length of the longest stop-string
        prefix that ends the stream."""
        back = None
        n = len(new)
        for k, s in enumerate(self.stops):
            st, f, L = self.state[k], self.fail[k], len(s)
            for i, c in enumerate(new):
                while st and s[st] != c:
                    st = f[st - 1]
                if s[st] == c:
                    st += 1
                if st == L:  # s ends at new[i]: it starts (n - 1 - i) + L characters before the end
                    b = n - 1 - i + L
                    back = b if back is None else max(back, b)
                    st = f[st - 1]
                    break
            self.state[k] = st
        return back, max(self.state, default=0)
