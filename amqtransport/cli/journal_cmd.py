"""``amq broker verify DATA_DIR`` and ``amq broker repair DATA_DIR``: a stopped broker's
journal, checked and salvaged offline (the rules: ``amqtransport/broker/store/salvage.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

__all__ = ["repair", "verify"]


def _journal_of(data_dir: str) -> Path:
    journal = Path(data_dir) / "journal"
    if not journal.is_dir():
        click.echo(f"error: no journal in {data_dir} (expected {journal}/): is it a broker's --data-dir?", err=True)
        sys.exit(2)
    return journal


@click.command("verify")
@click.argument("data_dir", type=click.Path(file_okay=False, exists=True))
def verify(data_dir: str) -> None:
    """Read every journal segment of DATA_DIR and report damage; change nothing.

    Exit codes: 0 no damage (a torn tail, which the next start cuts off, is not damage),
    1 damaged segments (`amq broker repair` salvages them) or lost records (a segment
    missing that compaction did not delete, a checkpoint that proves loss: the broker
    refuses to start until `amq broker repair` records it), 2 DATA_DIR holds no journal.
    """
    from amqtransport.broker.ha.lock import is_locked
    from amqtransport.broker.store.salvage import verify as verify_journal

    journal = _journal_of(data_dir)
    if is_locked(journal / "LOCK"):
        click.echo("note: a broker is running on this journal: its open segment may be mid-write", err=True)
    report = verify_journal(journal)
    for line in report.lines():
        click.echo(line)
    sys.exit(0 if report.ok else 1)


@click.command("repair")
@click.argument("data_dir", type=click.Path(file_okay=False, exists=True))
def repair(data_dir: str) -> None:
    """Salvage the damaged journal segments of a stopped broker's DATA_DIR.

    Each damaged segment and the checkpoint are first copied to
    DATA_DIR/journal/quarantine/<UTC time>/ (nothing is deleted); the segment is then
    rewritten with its intact records only, and the next start replays the whole
    journal. Lost records (missing segments, a checkpoint that proves loss) are noted
    in LOST.txt there and recorded as gone, so the broker starts without them. Exit codes: 0 repaired (or nothing to repair), 1 a broker holds the journal,
    2 DATA_DIR holds no journal.
    """
    from amqtransport.broker.store import Journal, StoreLockedError
    from amqtransport.broker.store.salvage import repair as repair_journal

    journal = _journal_of(data_dir)
    holder = Journal(journal)
    try:
        holder.lock()
    except StoreLockedError as exc:
        click.echo(f"error: {exc}: stop it before repairing", err=True)
        sys.exit(1)
    try:
        report, quarantine = repair_journal(journal)
    finally:
        holder.close()
    for line in report.lines():
        click.echo(line)
    if quarantine is None:
        click.echo("nothing to repair")
    else:
        click.echo(f"repaired {len(report.damaged)} segments; the originals and the checkpoint are in {quarantine}")
        if report.lost:
            click.echo(f"the loss is recorded (see {quarantine / 'LOST.txt'}): the broker now starts without those "
                       "records")
