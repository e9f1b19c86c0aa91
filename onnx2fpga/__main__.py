import sys

try:
    from .cli import main
except KeyboardInterrupt:         # Ctrl-C before the command line's own handler is in place
    print("error: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
