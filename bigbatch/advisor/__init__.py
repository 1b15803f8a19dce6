"""The advisor behind ``bigbatch plan --devices``: which batch, on how many devices, how long (docs/recipe.md,
"Which batch, how many devices"). ``model.py`` holds the arithmetic, ``links.py`` the interconnect presets,
``measure.py`` the short measurement on the device at hand, ``from_run.py`` what a finished run says about the
steps to a target, ``table.py`` the table the command prints and writes, ``command.py`` the command's checks and
``advisor.json``, ``show.py`` the predicted time ``bigbatch show`` prints from one."""
