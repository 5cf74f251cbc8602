"""The ``history`` verb: a job's bounded metric history for ``opsctl plot``.

The history itself (what the wrapper records, how it is downsampled) is
:mod:`remote_payload.agent.history`; this verb reads it (or replays ``events.jsonl`` for a
job whose wrapper predates it) and adds the marks only the status document knows (the hang
the wrapper recorded, diagnosis findings).
"""

from __future__ import annotations

import argparse
import os
import time
import typing as t

from remote_payload.agent import jobstore as jobs
from remote_payload.agent.history import (
    CAP,
    FIELDS,
    FILE,
    MARK_HANG,
    add_diagnosis_marks,
    from_events,
    read,
    reduce,
)
from remote_payload.agent.verbs import jobs as verbs_jobs


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", default=None, help="job id (default: the current job)")
    p.add_argument("--since", type=float, default=None,
                   help="only rows from the last SINCE seconds")
    p.add_argument("--points", type=int, default=CAP, help=f"at most this many rows (<= {CAP})")


def run(verb: str, args: argparse.Namespace) -> t.Any:
    job_id = jobs.resolve_job(args.root, args.job)
    path = jobs.job_dir(args.root, job_id)
    doc = read(path)
    source = FILE
    if doc is None:
        doc = from_events(os.path.join(path, jobs.EVENTS)).columns()
        source = jobs.EVENTS
    st = verbs_jobs.status_document(args.root, job_id, lines=0)
    now = time.time()
    since = None if args.since is None else now - args.since
    hist = reduce(doc, max(1, min(args.points, CAP)), FIELDS, since)
    hang = st.get("hang") or {}
    if isinstance(hang.get("at"), int | float) and not any(
            m.get("kind") == MARK_HANG for m in hist["marks"]):
        hist["marks"].append({"t": hang["at"], "kind": MARK_HANG,
                              "label": str(hang.get("summary") or "")[:120]})
    add_diagnosis_marks(hist, st.get("diagnosis") or [], st.get("ended_at") or now)
    return {"job_id": job_id, "name": st.get("name"), "state": st.get("state"),
            "phase": st.get("phase"), "created_at": st.get("created_at"),
            "started_at": st.get("started_at"), "ended_at": st.get("ended_at"), "now": now,
            "source": source, "diagnosis": st.get("diagnosis") or [], "history": hist}
