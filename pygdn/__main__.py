"""python -m pygdn {demo,bench,info} [options]   (run with --help for each)"""
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv.pop(0) if argv else "demo"
    if cmd in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0
    if cmd == "demo":
        from .demo import main as run
    elif cmd == "bench":
        from .bench import main as run
    elif cmd == "info":
        from .demo import info as run
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
