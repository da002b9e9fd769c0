#!/usr/bin/env bash
# The public surface of two versions side by side (issue 26: "keep the public behaviour byte-for-byte,
# and show it"): the OpenAPI document, the CLI's help texts and kernel listing, and an import and
# export of the shipped records, from an older wheel (the first argument) and from this checkout.
#   bash docs/benchmarks/public_surface.sh .whl_old/kernelsearch-0.1.0-py3-none-any.whl
set -eu
PY=${PY:-$PWD/.venv/bin/python}
W=$(mktemp -d)
"$PY" -m pip install -q --no-deps --target "$W/site_old" "$1"
for side in before after; do
  mkdir -p "$W/$side"
  PP=$([ $side = before ] && echo "$W/site_old" || echo "")
  export KS_DATABASE_URL=sqlite:///$W/$side/ks.db
  PYTHONPATH=$PP "$PY" -c "import json; from kernelsearch.service.api import create_app
print(json.dumps(create_app().openapi(), indent=1, sort_keys=True))" > "$W/$side/openapi.json"
  PYTHONPATH=$PP "$PY" -m kernelsearch.service.cli db upgrade >/dev/null 2>&1
  PYTHONPATH=$PP "$PY" -m kernelsearch.service.cli records import service/data/h200_records.json > "$W/$side/import.txt" 2>&1
  PYTHONPATH=$PP "$PY" -m kernelsearch.service.cli records export "$W/$side/export.json" >/dev/null 2>&1
  for c in "--help" "tune --help" "records --help" "bench --help" "worker --help" "serve --help" "kernels"; do
    echo "== kernelsearch $c"; PYTHONPATH=$PP "$PY" -m kernelsearch.service.cli $c 2>&1
  done > "$W/$side/cli.txt"
done
cd "$W"
cmp -s before/cli.txt after/cli.txt && echo "CLI help texts and kernel listing: identical" || echo "CLI: DIFFERENT"
cmp -s before/import.txt after/import.txt && echo "records import output: identical" || echo "import: DIFFERENT"
cmp -s <(grep -v '"exported_at"' before/export.json) <(grep -v '"exported_at"' after/export.json) \
  && echo "export of the shipped records: identical but for exported_at" || echo "export: DIFFERENT"
"$PY" - <<'PYEOF'
import json
a, b = (json.load(open(f"{s}/openapi.json")) for s in ("before", "after"))
pa, pb = a["paths"], b["paths"]
print("OpenAPI paths added:", sorted(set(pb) - set(pa)), "removed:", sorted(set(pa) - set(pb)))
for p in sorted(set(pa) & set(pb)):
    for m in sorted(set(pa[p]) | set(pb[p])):
        if pa[p].get(m) != pb[p].get(m):
            x, y = pa[p].get(m, {}), pb[p].get(m, {})
            print("OpenAPI operation changed:", m.upper(), p, sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k)))
sa, sb = a["components"]["schemas"], b["components"]["schemas"]
print("OpenAPI schemas added:", sorted(set(sb) - set(sa)), "removed:", sorted(set(sa) - set(sb)))
for k in sorted(set(sa) & set(sb)):
    if sa[k] != sb[k]:
        x, y = sa[k].get("properties", {}), sb[k].get("properties", {})
        print(f"OpenAPI schema {k}: properties added {sorted(set(y) - set(x))}, removed {sorted(set(x) - set(y))}, "
              f"changed {sorted(p for p in set(x) & set(y) if x[p] != y[p])}")
PYEOF
rm -rf "$W"
