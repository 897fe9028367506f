"""`python -m asyncrl_cli`."""

from asyncrl_cli.app import main

if __name__ == "__main__":
    main()
