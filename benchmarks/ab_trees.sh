# A/B of two source trees in one GPU call: `minfer bench` on a saved tree and on the working tree,
# alternating fresh processes, so that both see the same machine, clocks and history.
#
#   bash benchmarks/ab_trees.sh --save REV           # here (needs git): REV's packages into .carry/ab/REV
#   bash benchmarks/ab_trees.sh --save-worktree NAME # the working tree's packages as they are, and this script
#   bash benchmarks/ab_trees.sh .carry/ab/REV ROUNDS -- -m /tmp/7b.gguf -p 0 -n 128 -d 0,4096 -r 3
#   bash benchmarks/ab_trees.sh .carry/ab/A,.carry/ab/B ROUNDS -- ...   # several saved trees, then the working tree
#   bash .carry/ab/NAME/benchmarks/ab_trees.sh .carry/ab/REV ROUNDS -- ...   # NAME as the new side
#
# (--save-worktree keeps several uncommitted variants side by side for one call: edit, save, edit again.)
#
# With LLAMA_BENCH=/path/to/llama-bench, each round ends with llama-bench on the same arguments (minfer bench
# takes llama-bench's -m -p -n -d -r; give no others) plus `-fa 1 -ngl 99`, as the side "llama.cpp", so
# every round's figures have llama.cpp's beside them from the same call; a round where the binary is not
# there yet (a build still running) has none. The rounds end with one table of them (`ab_table.py`).
#
# The second form runs on the GPU machine after `source benchmarks/gpu_setup.sh` (carry `.carry`). Each
# process runs outside the repo, so Python imports minfer_core from the tree on PYTHONPATH rather than from
# the current directory (so give absolute paths in the bench arguments); the first lines printed say
# which files each side imported.
set -o pipefail
PKGS="configs minfer_core plugins/mmq_triton/minfer_mmq_triton plugins/f16_wmma/minfer_f16_wmma plugins/cuda_graphs/minfer_cuda_graphs"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "$1" = --save ]; then
  dest="$ROOT/.carry/ab/$2"
  rm -rf "$dest" && mkdir -p "$dest" && git -C "$ROOT" archive "$2" $PKGS | tar -x -C "$dest" && echo "$dest"
  exit $?
fi
if [ "$1" = --save-worktree ]; then
  dest="$ROOT/.carry/ab/$2"
  rm -rf "$dest" && mkdir -p "$dest/benchmarks" && (cd "$ROOT" && tar -c --exclude=__pycache__ $PKGS) |
    tar -x -C "$dest" && cp "$0" "$(dirname "$0")/ab_table.py" "$dest/benchmarks/" && echo "$dest"
  exit $?
fi
bases=(); for b in ${1//,/ }; do bases+=("$(cd "$b" && pwd)"); done
rounds=${2:-2}; shift 2; [ "$1" = -- ] && shift
path_of() {  # the tree's packages ahead of everything else (the carried gguf wheel's /tmp/site stays)
  local t=$1
  echo "$t:$t/plugins/mmq_triton:$t/plugins/f16_wmma:$t/plugins/cuda_graphs${PYTHONPATH:+:$PYTHONPATH}"
}
rows() {  # rows SIDE ROUND < a llama-bench style table: its pp/tg rows on one line, "SIDE rROUND: TEST | t/s | .."
  grep -E "^\| .* \| +(pp|tg)" | sed 's/.*| *\(pp\|tg\)/\1/' | tr -s ' ' | tr '\n' ' ' | sed "s/^/$1 r$2: /"
  echo
}
run() {  # run SIDE TREE ROUND: one fresh process, its table rows on one line
  (cd /tmp && PYTHONPATH=$(path_of "$2") python -m minfer_core.cli bench "${@:4}" 2>>"${OUT:-/tmp}/ab_$1.log") |
    rows "$1" "$3"
}
side_of() {  # a tree's label: "new" for the working tree, "base" for a lone saved tree, else its folder's name
  if [ "$1" = "$ROOT" ]; then echo new; elif [ ${#bases[@]} = 1 ]; then echo base; else basename "$1"; fi
}
for tree in "${bases[@]}" "$ROOT"; do
  side=$(side_of "$tree")
  (cd /tmp && PYTHONPATH=$(path_of "$tree") python -c \
    "import minfer_core, minfer_mmq_triton; print('$side:', minfer_core.__file__, minfer_mmq_triton.__file__)")
done
llama() {  # llama ROUND ARGS..: llama-bench on the bench arguments, its rows on one line as run() prints them
  [ -x "${LLAMA_BENCH:-}" ] || return 0
  "$LLAMA_BENCH" "${@:2}" -fa 1 -ngl 99 2>>"${OUT:-/tmp}/ab_llama.log" | rows llama.cpp "$1"
}
lines="${OUT:-/tmp}/ab_lines.txt"
for r in $(seq "$rounds"); do
  for tree in "${bases[@]}" "$ROOT"; do run "$(side_of "$tree")" "$tree" "$r" "$@"; done
  llama "$r" "$@"
done | tee "$lines"
echo; python3 "$(dirname "$0")/ab_table.py" < "$lines"  # the rounds as one table (means, ratios)
