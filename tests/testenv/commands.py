"""Running the harness's commands: a command that fails says what it printed.

``subprocess.run(check=True)`` raises ``CalledProcessError``, whose message is the argv and the exit code only; a
failing report then hides why (the fresh-machine failure of issue 50: ``kubectl wait`` exited 1 and the report did
not say what it printed). ``run_command`` raises ``CommandFailed``, whose message carries the tails of both streams.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

#: Characters of each stream a ``CommandFailed`` message keeps (the ends: where a command says why it stopped).
SHOWN_CHARACTERS = 4000


class CommandFailed(subprocess.CalledProcessError):
    """Raised when a harness command exits non-zero; its message carries the tails of stdout and stderr."""

    def __str__(self) -> str:
        shown = [super().__str__()]
        for label, text in (("stderr", self.stderr), ("stdout", self.output)):
            if isinstance(text, bytes):
                text = text.decode(errors="replace")
            if text and text.strip():
                shown.append(
                    f"--- its {label} (last {SHOWN_CHARACTERS} characters) ---\n{text.strip()[-SHOWN_CHARACTERS:]}"
                )
        return "\n".join(shown)


def run_command(
    command: Sequence[str | Path],
    *,
    check: bool = True,
    input: str | None = None,
    timeout: float | None = 120,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with its output captured as text; with ``check``, raise ``CommandFailed`` if it fails."""
    argv = [str(part) for part in command]
    done = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=timeout, cwd=cwd, env=env)
    if check and done.returncode != 0:
        raise CommandFailed(done.returncode, argv, done.stdout, done.stderr)
    return done
