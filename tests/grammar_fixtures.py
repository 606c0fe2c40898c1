"""
Synthetic compiled grammars that follow the CompiledGrammar contract (notes/grammar_contract.md) exactly,
for testing the masker and kernels without the real compiler.

Layout of a random grammar:
  token ids 0, 1 (unk, BOS) -> class 0, whose column is all -1 (never legal); id 2 is EOS, alone in class C-1.
  states 0 .. S-2 are ordinary or final; S-1 is done_state. The last `num_final` ordinary states are final:
  only EOS is legal there and it leads to done_state; done_state only allows EOS, back to itself.
  Every non-final state has at least one edge to a higher-numbered state, so a final state is always reachable
  (finish_text is defined everywhere); the other (state, class) cells are random states or random -1 holes.
"""
from collections import deque
from types import SimpleNamespace

import torch

EOS_ID = 2
_ALPHABET = "abcdefghijklmnopqrstuvwxyz{}:,\" 0123456789éü€"  # a few multi-byte UTF-8 characters too


def make_random_grammar(num_states: int = 40, num_classes: int = 12, vocab_size: int = 300,
                        hole_frac: float = 0.6, num_final: int = 3, seed: int = 0,
                        index_dtype: torch.dtype = torch.int16, device: str = "cpu") -> SimpleNamespace:
    """A random grammar with the CompiledGrammar fields and methods the masker uses."""
    S, C, V = num_states, num_classes, vocab_size
    assert S >= num_final + 2 and C >= 3 and V >= C + 1
    g = torch.Generator().manual_seed(seed)
    done, eos_class = S - 1, C - 1

    # token classes: ids 0,1 control (class 0), id 2 EOS, then every text class gets at least one token
    token_class = torch.empty(V, dtype=torch.int64)
    token_class[:2] = 0
    token_class[EOS_ID] = eos_class
    text_classes = torch.arange(1, eos_class)  # classes 1 .. C-2
    rest = V - 3
    token_class[3:3 + len(text_classes)] = text_classes[:rest]
    if rest > len(text_classes):
        token_class[3 + len(text_classes):] = torch.randint(1, eos_class, (rest - len(text_classes),), generator=g)

    # transitions among ordinary states 0 .. S-2
    ordinary = S - 1
    finals = list(range(ordinary - num_final, ordinary))
    class_next = torch.randint(0, ordinary, (S, C), generator=g)
    holes = torch.rand(S, C, generator=g) < hole_frac
    class_next[holes] = -1
    class_next[:, 0] = -1  # control ids: never legal
    class_next[:, eos_class] = -1  # EOS: only from final states (below)
    for s in range(ordinary - num_final):  # a forward edge guarantees a final state is reachable
        c = int(torch.randint(1, eos_class, (1,), generator=g))
        class_next[s, c] = int(torch.randint(s + 1, ordinary, (1,), generator=g))
    class_next[finals] = -1
    class_next[finals, eos_class] = done
    class_next[done] = -1
    class_next[done, eos_class] = done

    class_size = torch.bincount(token_class, minlength=C)  # [C]
    legal_count = ((class_next >= 0).long() * class_size).sum(1)  # [S]
    final = torch.zeros(S, dtype=torch.bool)
    final[finals] = True
    final[done] = True

    token_bytes = [b"", b"", b""] + [_random_text(g) for _ in range(V - 3)]
    return _namespace(token_class, class_next, legal_count, final, start=0, eos_id=EOS_ID, done_state=done,
                      token_bytes=token_bytes, index_dtype=index_dtype, device=device)


def make_loop_grammar(logit_classes: int = 8, vocab_size: int = 64, index_dtype: torch.dtype = torch.int16,
                      device: str = "cpu") -> SimpleNamespace:
    """A grammar whose start state loops on itself through token ids 3 .. 3+logit_classes-1 (one class each);
    every other id is illegal there. State 1 is final (reached by id 3+logit_classes), state 2 is done.
    Handy for distribution tests: a row can be sampled many times without leaving the start state."""
    V, k = vocab_size, logit_classes
    assert V >= k + 5
    C = k + 3  # 0 control, 1..k loop ids, k+1 'end' id, k+2 EOS
    token_class = torch.zeros(V, dtype=torch.int64)
    token_class[EOS_ID] = C - 1
    token_class[3:3 + k] = torch.arange(1, k + 1)
    token_class[3 + k] = k + 1
    # ids beyond 3+k stay in class 0 (never legal)
    class_next = torch.full((3, C), -1, dtype=torch.int64)
    class_next[0, 1:k + 1] = 0
    class_next[0, k + 1] = 1
    class_next[1, C - 1] = 2
    class_next[2, C - 1] = 2
    legal_count = ((class_next >= 0).long() * torch.bincount(token_class, minlength=C)).sum(1)
    final = torch.tensor([False, True, True])
    token_bytes = [b"", b"", b""] + [bytes([ord("a") + i]) for i in range(k)] + [b"."] + [b"?"] * (V - 4 - k)
    return _namespace(token_class, class_next, legal_count, final, start=0, eos_id=EOS_ID, done_state=2,
                      token_bytes=token_bytes, index_dtype=index_dtype, device=device)


def _random_text(g: torch.Generator) -> bytes:
    n = int(torch.randint(1, 4, (1,), generator=g))
    idx = torch.randint(0, len(_ALPHABET), (n,), generator=g).tolist()
    return "".join(_ALPHABET[i] for i in idx).encode("utf-8")


def _namespace(token_class, class_next, legal_count, final, *, start, eos_id, done_state, token_bytes,
               index_dtype, device) -> SimpleNamespace:
    """Wrap the tables in an object with the contract's fields and methods."""
    S, C = class_next.shape
    V = token_class.numel()
    ns = SimpleNamespace(
        token_class=token_class.to(device=device, dtype=torch.int32),  # [V]
        class_next=class_next.to(device=device, dtype=index_dtype),    # [S, C]
        legal_count=legal_count.to(device=device, dtype=torch.int32),  # [S]
        final=final.to(device),                                        # [S]
        num_states=S, num_classes=C, vocab_size=V, start=start, eos_id=eos_id, done_state=done_state,
        device=torch.device(device), token_bytes=token_bytes,
    )
    ns.next_state = lambda states, tokens: ns.class_next[states.long(), ns.token_class[tokens.long()].long()].long()
    ns.allowed = lambda states: ns.class_next[states.long()][:, ns.token_class.long()] >= 0
    ns.is_final = lambda states: ns.final[states.long()]
    ns.legal_counts = lambda states: ns.legal_count[states.long()]
    ns.nbytes = sum(t.numel() * t.element_size() for t in (ns.token_class, ns.class_next, ns.legal_count, ns.final))
    ns.finish_text = lambda state: _finish_text(ns, state)
    return ns


def _finish_text(ns: SimpleNamespace, state: int) -> str:
    """Shortest text from state to a final state (breadth-first over classes, first token of each class)."""
    table = ns.class_next.long().cpu().tolist()
    final = ns.final.cpu().tolist()
    first_token = {}
    for tok, c in enumerate(ns.token_class.tolist()):
        first_token.setdefault(c, tok)
    eos_class = int(ns.token_class[ns.eos_id])
    prev = {state: None}
    queue = deque([state])
    while queue:
        s = queue.popleft()
        if final[s]:
            path = []
            while prev[s] is not None:
                s, tok = prev[s]
                path.append(ns.token_bytes[tok])
            return b"".join(reversed(path)).decode("utf-8")
        for c, nxt in enumerate(table[s]):
            if nxt >= 0 and c != eos_class and nxt not in prev:
                prev[nxt] = (s, first_token[c])
                queue.append(nxt)
    raise ValueError(f"state {state}: no final state is reachable")
