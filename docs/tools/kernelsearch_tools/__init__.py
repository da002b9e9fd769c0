"""kernelsearch's measurement tools, each run as `python -m kernelsearch_tools.NAME -h`; they may
use kernelsearch's internals, and kernelsearch never imports them."""
