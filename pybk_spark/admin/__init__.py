"""Operator tooling: the auditor, dead-writer recovery, re-replication, and the
``pybk`` admin shell commands.

Pure decisions live in ``audit`` and ``entry_sets`` (no I/O, no clock: time
is passed in); ``recover`` and ``rereplicate`` are thin I/O drivers used both
in-process (``pybk recover`` / ``pybk rereplicate``) and by the spark-submit
jobs in ``jobs/``; ``shell_*`` register the subcommands in ``shell_common``, and
``pybk_spark.commands.cli`` imports them.
"""
