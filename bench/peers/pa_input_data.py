#!/usr/bin/env python3
"""Writes perf_analyzer --input-data files holding only `query` for our server.

  pa_input_data.py OUT.json --shape 1,16,256 [--seed 0]

The tensor is stored flat (perf_analyzer reshapes it with --shape query:...). Every
value is written with a decimal point: perf_analyzer reads FP32 data only from JSON
numbers that parse as doubles, so an integer such as 0 or 1 is refused ("unable to
find float data in json").
"""
import argparse
import json
import math
import random


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--shape", default="1,16,256", help="query shape N,L,E (default 1,16,256)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = [int(d) for d in args.shape.split(",")]
    rng = random.Random(args.seed)
    values = [rng.uniform(-1.0, 1.0) for _ in range(math.prod(shape))]
    # repr() of a Python float always has a '.' or an exponent; json.dump keeps it.
    with open(args.out, "w") as f:
        json.dump({"data": [{"query": values}]}, f)
    print(f"wrote {args.out}: query {shape}, {len(values)} float32 values")


if __name__ == "__main__":
    main()
