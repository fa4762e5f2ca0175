#!/usr/bin/env python3
"""Groups a heaptrack peak profile by allocation site, per call (issue 16's memory per call).

Input: the stacks `heaptrack_print -f FILE -F STACKS --flamegraph-cost-type peak` writes (one
`frame;frame;…;frame BYTES` line per backtrace: bytes live at the heap's peak). Each stack is
charged to its leaf-most frame that names something (allocator, `alloc::`, `core::`, `bytes::`,
`std::` and unresolved frames skipped). Usage: heap-peaks.py STACKS CALLS [TOP]
"""
import collections
import re
import sys

SKIP = re.compile(
    r"^(0x|\?\?|alloc::|_\$LT\$alloc|core::|bytes::|__rust|_RN|malloc|realloc|calloc|std::"
    r"|hashbrown|$)"
)


def main() -> None:
    path, calls = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    sites: collections.Counter = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, n = line.rsplit(" ", 1)
            n = int(n)
            total += n
            frames = [re.sub(r"::h[0-9a-f]{16}$", "", fr) for fr in stack.split(";")]
            key = next((fr for fr in reversed(frames) if not SKIP.match(fr)), "(unresolved)")
            sites[key[:140]] += n
    print(f"heap at peak: {total / 1024:.0f} KiB, {total / 1024 / calls:.1f} KiB per call")
    print("| KiB per call | KiB | site |\n|---:|---:|---|")
    for site, n in sites.most_common(top):
        print(f"| {n / 1024 / calls:.1f} | {n / 1024:.0f} | `{site}` |")


if __name__ == "__main__":
    main()
