"""`torchlab prepare SOURCE OUT`: write a prepared copy of an ImageFolder (torchlab/data/prepared.py), which loads
faster; a rerun finishes an interrupted one."""

from torchlab import io, machine, parsing
from torchlab.data import decode, folder, prepared

jpeg_quality = parsing.number(int, 1, at_most=100)


def main(argv=None, prog="torchlab prepare"):
    parser = parsing.OneLineErrorParser(prog=prog, description=prepared.__doc__.split("\n\n")[0])
    parser.add_argument("source", help="an ImageFolder, as train.py's --data takes it")
    parser.add_argument("out_dir", help="the prepared copy to write (or to finish, after an interruption)")
    parser.add_argument(
        "--short-side", type=parsing.image_size, default=256, help="short side of the stored images, px (default: 256)"
    )
    parser.add_argument(
        "--quality", type=jpeg_quality, default=90, help="JPEG quality of the stored images, 1-100 (default: 90)"
    )
    parser.add_argument(
        "--val-fraction",
        type=parsing.fraction,
        default=0.1,
        help="share held out for validation when SOURCE has no val/ folder (default: 0.1)",
    )
    parser.add_argument(
        "--seed", type=parsing.seed, default=0, help="seed of that hold-out, as train.py's --seed (default: 0)"
    )
    args = parser.parse_args(argv)
    try:
        written = prepared.prepare(
            args.source,
            args.out_dir,
            args.short_side,
            args.quality,
            args.val_fraction,
            args.seed,
            processes=machine.usable_cpu_count(),
        )
        unreadable = prepared.unreadable_paths(args.out_dir)
    except folder.DataError as error:
        io.exit_with_error(prog, error)
    print(f"{'wrote' if written else 'already complete:'} {args.out_dir}")
    if unreadable:  # kept as samples, as train.py would meet them in the source: it skips and names each
        named = ", ".join(unreadable[: decode.UNREADABLE_EXAMPLES])
        print(f"{len(unreadable)} unreadable images kept as empty samples (train.py skips and names them): {named}")


if __name__ == "__main__":
    main()
