"""``python -m bigbatch``: the same entry point as the installed ``bigbatch`` script."""

if __name__ == "__main__":
    from bigbatch.entry import run

    run()
