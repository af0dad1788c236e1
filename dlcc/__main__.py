"""`python -m dlcc ...`: the same CLI as the `dlcc` command, for environments where the console
script is not on PATH (a `pip install --target` into a folder whose bin/ already existed, as on a
lent GPU machine)."""
from .cli import main

main()
