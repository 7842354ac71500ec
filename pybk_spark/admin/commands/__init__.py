"""The ``pybk`` operator subcommands: each ``shell_*`` module registers its
commands in ``shell_common`` when imported."""
