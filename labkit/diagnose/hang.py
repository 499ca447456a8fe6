"""Which rank a hung job waits for, from its ranks' Flight Recorder dumps.

Every rank numbers the collectives it issues on a process group 1, 2, 3, … (``collective_seq_id``), so
collective #k on one rank is collective #k on every other member of the group — whatever the clocks say.
On gloo completion is not tracked (an entry's ``state`` stays ``scheduled``, and ``retired`` is also set
when a collective fails on its timeout), so the hang is read from the numbers and ops across ranks, per
process group (torch's analyser ``torch.distributed.flight_recorder`` matches them the same way):

1. **mismatch** — the first #k that every member recorded but not the same way: another op, other
   sizes, another dtype. When the odd rank's #k is what the others issue at #k+1 (or #k−1) it is an
   **order desync** (it skipped, or added, a collective). A mismatch hangs or crashes the job there.
2. **not reached** — the first #k some members issued and others did not: the others sit in #k
   waiting; the ranks without #k did not reach it (a stalled data loader, a rank that exited, one that
   skipped it). When the ranks that did reach #k are the fewer, they are the odd ones (they ran ahead
   into a collective the rest never called).
3. Across groups: a rank missing from #k of one group may itself wait in another group. The primary
   finding is a mismatch, else a group whose missing ranks wait nowhere (the root stall), else — a
   cycle of waits, the mark of a desync — the group where the fewest ranks are missing.

A dump missing for a rank (it died by a signal, its host went away) is named; its collectives are
unknown, so it is neither blamed nor cleared. A job whose groups all agree on every collective is not
hung. Point-to-point ops (send/recv, numbered by ``p2p_seq_id``) are not matched. The odd ranks are the *minority*: with no majority (2 against 2) both sides are named — and a wait cycle with
no majority (2 ranks, each waiting for the other) is said to be ambiguous: the dumps cannot tell who left the order.

Taught in chapter 27 (hang diagnosis from Flight Recorder dumps).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from labkit.trace.flight import FlightDump, FlightEntry, read_dumps

__all__ = ["GroupFinding", "HangDiagnosis", "diagnose_hang", "KINDS"]

KINDS = ("not_reached", "ran_ahead", "op", "size", "dtype", "order", "no_dump")


@dataclass
class GroupFinding:
    """What went wrong on one process group. Taught in chapter 27."""

    group: str                         # the process group's name ("0": the default group)
    group_desc: str                    # its description (with its name when descriptions repeat)
    kind: str                          # one of KINDS
    seq: int                           # the collective's number in the group
    op: str                            # what the majority (or the ranks that reached it) issued there
    input_sizes: tuple
    dtypes: tuple
    culprits: list[int]                # the odd ranks
    waiting: list[int]                 # ranks that issued #seq and wait in it
    missing: list[int]                 # members without #seq (not reached)
    variants: list[dict] = field(default_factory=list)   # for a mismatch: each variant and its ranks
    detail: str = ""


@dataclass
class HangDiagnosis:
    """The diagnosis: ``hung``, the primary finding's ranks, collective and kind, every group's finding,
    each rank's last collective per group, and :meth:`explain` (one paragraph). Taught in chapter 27."""

    hung: bool
    ranks: list[int]                   # ranks with a dump
    world_size: int
    missing_dumps: list[int]
    culprits: list[int] = field(default_factory=list)
    kind: str | None = None
    seq: int | None = None
    op: str | None = None
    input_sizes: tuple | None = None
    dtypes: tuple | None = None
    group: str | None = None
    group_desc: str | None = None
    findings: list[GroupFinding] = field(default_factory=list)
    last_seq: dict = field(default_factory=dict)     # group description → {rank: its last collective number}
    paragraph: str = ""

    def explain(self) -> str:
        return self.paragraph

    def to_dict(self) -> dict:
        return asdict(self)


def _label(e: FlightEntry) -> str:
    return f"{e.op} {list(map(list, e.input_sizes))} {'/'.join(e.input_dtypes) or '-'}"


def _sig(e: FlightEntry) -> tuple:
    return (e.op, e.input_sizes, e.output_sizes, e.input_dtypes, e.output_dtypes)


def _gname(group: str, desc: str) -> str:
    return f"'{desc}'" + (f" (group {group})" if desc != group else "")


def _verb(rs, one: str, many: str) -> str:
    return one if len(list(rs)) == 1 else many


def _ranks(rs) -> str:
    rs = sorted(rs)
    return (f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}")


def _members(dumps: list[FlightDump], group: str, desc: str, world: int) -> tuple[set[int], set[int]]:
    """The group's ranks, and those of them assumed. The default group is the world; another group's are
    the ranks pg_config lists (it lists none on gloo in torch 2.13), else those that recorded anything on
    it — plus, when every one of those sits in the group's last collective (its latest entry), each
    dumped rank that recorded nothing on any group of that description: a rank that stalled before the
    group's first collective (assumed; a rank outside a one-off group is the other reading)."""
    if group == "0" or desc == "default_pg":
        return set(range(world)), set()
    for d in dumps:
        cfg = d.pg_config.get(group)
        if isinstance(cfg, dict) and isinstance(cfg.get("ranks"), str) and cfg["ranks"].strip("[] "):
            try:
                return {int(x) for x in cfg["ranks"].strip("[]").split(",")}, set()
            except ValueError:
                pass
    on = {d.rank for d in dumps if any(e.group == group and not e.is_p2p for e in d.entries)}
    sitting = all(d.entries and d.entries[-1].group == group for d in dumps if d.rank in on)
    assumed = {d.rank for d in dumps if d.rank not in on and not any(
        e.group_desc == desc and not e.is_p2p for e in d.entries)} if sitting else set()
    return on | assumed, assumed


def _labels(dumps: list[FlightDump]) -> dict[str, str]:
    """Group name → how the diagnosis names it: its description, with the name when descriptions repeat."""
    pairs = {(e.group, e.group_desc) for d in dumps for e in d.entries if not e.is_p2p}
    count: dict[str, int] = {}
    for _, desc in pairs:
        count[desc] = count.get(desc, 0) + 1
    return {g: desc if count[desc] == 1 and desc not in ("", "undefined") else f"{desc or 'group'} {g}"
            for g, desc in pairs}


def _mismatch(group, desc, seq, at: dict[int, FlightEntry], table: dict[int, dict[int, FlightEntry]]):
    variants: dict[tuple, list[int]] = {}
    for r, e in sorted(at.items()):
        variants.setdefault(_sig(e), []).append(r)
    ordered = sorted(variants.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    major_sig, major = ordered[0]
    tie = len(ordered) > 1 and len(ordered[1][1]) == len(major)
    odd = sorted(r for s, rs in ordered[1:] for r in rs) if not tie else sorted(at)
    ref = at[major[0]]
    first_odd = at[odd[0]] if not tie else at[ordered[1][1][0]]
    kind = ("op" if first_odd.op != ref.op else "dtype" if (first_odd.input_dtypes, first_odd.output_dtypes) !=
            (ref.input_dtypes, ref.output_dtypes) and first_odd.input_sizes == ref.input_sizes else "size")
    detail = ""
    if not tie:        # an order desync: the odd rank issues here what the others issue one step on (or back)
        for shift, what in ((1, "skipped"), (-1, "added")):
            nxt = [table[r].get(seq + shift) for r in major]
            if all(n is not None and _sig(n) == _sig(first_odd) for n in nxt) and all(
                    table[r].get(seq - shift) is not None and _sig(table[r][seq - shift]) == major_sig for r in odd
                    if seq - shift >= 1 and seq - shift in table[r]):
                kind = "order"
                detail = (f"{_ranks(odd)} {what} a collective: its #{seq} ({_label(first_odd)}) is what "
                          f"{_ranks(major)} issue at #{seq + shift}")
                break
    return GroupFinding(group, desc, kind, seq, ref.op, ref.input_sizes, ref.input_dtypes, odd, sorted(at), [],
                        [{"op": at[rs[0]].op, "input_sizes": at[rs[0]].input_sizes,
                          "dtypes": at[rs[0]].input_dtypes, "ranks": rs} for _, rs in ordered], detail)


def _group_finding(dumps: list[FlightDump], group: str, desc: str, world: int, last: dict, label: str):
    members, assumed = _members(dumps, group, desc, world)
    dumped = {d.rank for d in dumps} & members
    table = {d.rank: {e.seq: e for e in d.entries if e.group == group and not e.is_p2p}
             for d in dumps if d.rank in dumped}
    last[label] = {r: max(t, default=0) for r, t in table.items()}
    start = max((min(t) for t in table.values() if t), default=1)   # the ring buffer may have dropped early ones
    top = max(last[label].values(), default=0)
    for seq in range(start, top + 1):
        at = {r: t[seq] for r, t in table.items() if seq in t}
        if len({_sig(e) for e in at.values()}) > 1:
            return _mismatch(group, label, seq, at, table)
        if len(at) < len(dumped):
            missing = sorted(dumped - set(at))
            reached = sorted(at)
            ref = at[reached[0]]
            ahead = len(reached) < len(missing)
            note = (f" ({_ranks(assumed)} recorded nothing on this group: taken as "
                    f"{_verb(assumed, 'a member that never reached', 'members that never reached')} its first "
                    "collective, since the dumps do not list the group's ranks)") if set(missing) & assumed else ""
            return GroupFinding(group, label, "ran_ahead" if ahead else "not_reached", seq, ref.op, ref.input_sizes,
                                ref.input_dtypes, reached if ahead else missing, reached, missing,
                                detail=(f" They issued it at {ref.call_site}." if ref.call_site else "") + note)
    return None


def _waits_in(dump: FlightDump, findings: list[GroupFinding]) -> GroupFinding | None:
    """The finding whose collective this rank sits in: its latest entry is that group's #seq or later."""
    if not dump.entries:
        return None
    e = dump.entries[-1]
    for f in findings:
        if f.group == e.group and e.seq >= f.seq and dump.rank in f.waiting:
            return f
    return None


def _primary(findings: list[GroupFinding], dumps: list[FlightDump]) -> GroupFinding:
    mism = [f for f in findings if f.kind not in ("not_reached", "ran_ahead")]
    if mism:
        return mism[0]
    by_rank = {d.rank: d for d in dumps}
    roots = [f for f in findings if f.kind == "not_reached" and not any(
        r in by_rank and _waits_in(by_rank[r], findings) for r in f.missing)]
    if roots:
        return roots[0]
    return min(findings, key=lambda f: (f.kind != "not_reached", len(f.culprits), f.seq))


def _paragraph(dg: HangDiagnosis, dumps: list[FlightDump]) -> str:
    n = len(dg.ranks)
    lost = (f" No dump from {_ranks(dg.missing_dumps)} (it died before it could write one, or its dump was "
            "lost): its collectives are unknown." if dg.missing_dumps else "")
    if not dg.hung and dg.kind == "no_dump":
        return (f"Not shown hung: the {n} dumps agree on every collective, but {_ranks(dg.missing_dumps)} left "
                f"no dump (it died before it could write one, or its dump was lost) — if the job hung, the others "
                f"wait for {_ranks(dg.missing_dumps)}: "
                + "; ".join(f"'{k}': last collective #{max(v.values(), default=0)} on {_ranks(v)}"
                            for k, v in dg.last_seq.items()) + ".")
    if not dg.hung:
        groups = ", ".join(f"'{k}' #{max(v.values(), default=0)}" for k, v in dg.last_seq.items())
        return (f"Not hung: the {n} rank dumps agree on every collective of every process group (each rank's "
                f"last: {groups or 'none recorded'}) — no rank is missing from a collective and none disagree "
                f"on op, size or dtype.{lost}")
    f = dg.findings[0]
    g = _gname(f.group, f.group_desc)
    what = f"{f.op} of {list(map(list, f.input_sizes))} {'/'.join(f.dtypes) or ''}".rstrip()
    if f.kind == "not_reached":
        s = (f"Hung: {_ranks(f.culprits)} did not reach collective #{f.seq} on process group {g} — {what} — "
             f"which {_ranks(f.waiting)} issued and wait in; last collective there: "
             + ", ".join(f"#{dg.last_seq[f.group_desc][r]} on rank {r}" for r in f.culprits) + ".")
    elif f.kind == "ran_ahead":
        s = (f"Hung: {_ranks(f.culprits)} issued collective #{f.seq} on process group {g} — {what} — which "
             f"{_ranks(f.missing)} never reached.")
    else:
        parts = "; ".join(f"{_ranks(v['ranks'])}: {v['op']} {list(map(list, v['input_sizes']))} "
                          f"{'/'.join(v['dtypes'])}" for v in f.variants)
        name = {"op": "an op mismatch", "size": "a size mismatch", "dtype": "a dtype mismatch",
                "order": "an order desync"}[f.kind]
        s = (f"Hung on {name} at collective #{f.seq} on process group {g}: {parts}. "
             f"The odd one{'s' if len(f.culprits) > 1 else ''}: {_ranks(f.culprits)}"
             + (f" — {f.detail}" if f.detail else "") + ".")
    if f.kind == "not_reached" and f.detail:
        s += f.detail
    for o in dg.findings[1:]:
        og = _gname(o.group, o.group_desc)
        if o.kind in ("not_reached", "ran_ahead"):
            cycle = set(o.waiting) <= set(f.culprits) and set(o.missing) & set(f.waiting)
            even = len(set(f.culprits)) == len(set(f.waiting))     # no majority: 1 against 1, 2 against 2
            s += (f" {'Meanwhile' if cycle else 'Also'}, on {og} {_ranks(o.waiting)} "
                  f"{_verb(o.waiting, 'waits', 'wait')} in #{o.seq} ({o.op}) for {_ranks(o.missing)}"
                  + (" — each side waits for the other: the ranks are out of step (a desync), and "
                     + (f"{_ranks(f.culprits)} is the one that left the common order" if not even else
                        f"with {len(f.culprits)} rank{'s' if len(f.culprits) > 1 else ''} on each side the dumps "
                        f"cannot say which side left the common order — {_ranks(f.culprits)} or "
                        f"{_ranks(f.waiting)}: the side named first is not more to blame; compare each side's "
                        "code path (its call sites) with the order the job should issue")
                     if cycle else "") + ".")
        else:
            s += f" Also, on {og}: a{'n' if o.kind in ('op', 'order') else ''} {o.kind} mismatch at #{o.seq}."
    return s + lost


def diagnose_hang(source: str | os.PathLike | list[FlightDump], *, world_size: int | None = None) -> HangDiagnosis:
    """Diagnose a job from its ranks' Flight Recorder dumps: a folder (:func:`labkit.trace.flight.read_dumps`)
    or dumps already read. ``world_size``: the job's ranks, when dumps may be missing for the highest ones
    (default: the highest rank with a dump + 1, or the ranks a dump's pg_config lists).
    Returns :class:`HangDiagnosis` (``.explain()`` is the paragraph). Taught in chapter 27."""
    if isinstance(source, str | os.PathLike):
        dumps = read_dumps(source)[0]
    elif isinstance(source, list | tuple):
        dumps = list(source)
    else:
        raise TypeError(f"diagnose_hang needs a folder of Flight Recorder dumps or a list of FlightDump, got "
                        f"{type(source).__name__} {source!r:.60}")
    if not dumps or not all(isinstance(d, FlightDump) for d in dumps):
        raise TypeError("diagnose_hang needs a folder of Flight Recorder dumps or a non-empty list of FlightDump")
    listed = [int(x) for d in dumps for c in d.pg_config.values() if isinstance(c, dict)
              for x in str(c.get("ranks", "")).strip("[] ").split(",") if x.strip().isdigit()]
    world = max([d.rank + 1 for d in dumps] + [r + 1 for r in listed])
    if world_size is not None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < world:
            raise ValueError(f"world_size={world_size!r} is not valid: the dumps name rank(s) up to {world - 1}, "
                             f"so it must be an int >= {world}")
        world = world_size
    ranks = sorted(d.rank for d in dumps)
    dg = HangDiagnosis(hung=False, ranks=ranks, world_size=world,
                       missing_dumps=sorted(set(range(world)) - set(ranks)))
    groups = sorted({(e.group, e.group_desc) for d in dumps for e in d.entries if not e.is_p2p},
                    key=lambda gd: (gd[0] != "0", gd[0]))
    labels = _labels(dumps)
    findings = [f for g, desc in groups if (f := _group_finding(dumps, g, desc, world, dg.last_seq, labels[g]))]
    if findings:
        first = _primary(findings, dumps)
        dg.findings = [first] + [f for f in findings if f is not first]
        dg.hung = True
        dg.culprits, dg.kind, dg.seq, dg.op = first.culprits, first.kind, first.seq, first.op
        dg.input_sizes, dg.dtypes, dg.group, dg.group_desc = first.input_sizes, first.dtypes, first.group, first.group_desc
    elif dg.missing_dumps:     # the dumps agree; a rank without one is the only place left to look
        dg.kind, dg.culprits = "no_dump", list(dg.missing_dumps)
    dg.paragraph = _paragraph(dg, dumps)
    return dg

