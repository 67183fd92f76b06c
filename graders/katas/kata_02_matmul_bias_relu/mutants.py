"""Kata 02: plausible wrong solutions, each caught at the level that should catch it."""
from graders.run import Mutant, Variant, reference_source

from . import models

REFERENCE = reference_source("02_matmul_bias_relu")
FUSED = "torch.matmul(x, w).add_(b).relu_()"
BIAS_ADDS = """BIAS_ADDS = [
    lambda p, b: p + b,
    lambda p, b: b + p,  # no commutativity: the commuted add is another pattern
    lambda p, b: torch.add(p, b),
    lambda p, b: torch.add(b, p),
]"""
PATTERNS_AND_PASS = REFERENCE[REFERENCE.index("def spelled_pattern("):]
# "The matmul stays as it is; only its epilogue needs fusing": the product becomes a placeholder, so
# the matcher no longer checks who else reads it.
EPILOGUE_ONLY = """def spelled_pattern(bias_add, relu):
    def spelling(p, b):
        return relu(bias_add(p, b))

    return spelling


def epilogue_in_place(p, b):
    return p.add_(b).relu_()


def fuse_matmul_bias_relu(gm: fx.GraphModule) -> int:
    rewritten = 0
    for spelling in itertools.product(BIAS_ADDS, RELUS):
        rewritten += len(subgraph_rewriter.replace_pattern(gm, spelled_pattern(*spelling), epilogue_in_place))
    return rewritten
"""
# One pattern per spelling the visible models use, instead of every combination (positions in the reference's
# tables, which list the spellings in the order of models.py's).
SEEN_SPELLINGS = sorted(tuple(list(table).index(key) for table, key in zip(
    (models.MATMULS, models.BIAS_ADDS, models.RELUS), spelling)) for spelling in models.VISIBLE_SPELLINGS)
HAND_LISTED = (f"PATTERNS = [spelled_pattern(MATMULS[m], BIAS_ADDS[a], RELUS[r]) for m, a, r in {SEEN_SPELLINGS}]\n")

FILTERED_CALL = """replace_pattern_with_filters(gm, spelling, TRACED_REPLACEMENT,
                                                                        [epilogue_is_exact]))"""
TRACED = "TRACED_PATTERNS, TRACED_REPLACEMENT = [fx.symbolic_trace(p) for p in PATTERNS], fx.symbolic_trace(replacement)\n"
# "torch.mm is 2-D only, so addmm is exact there": one GEMM with the bias for the 16 mm spellings (the last of
# the 48 patterns). But a literal bias, which the add accepts, addmm refuses: its bias must be a tensor.
MM_TO_ADDMM_TAIL = REFERENCE[REFERENCE.index(TRACED):]
MM_TO_ADDMM = (MM_TO_ADDMM_TAIL
               .replace(TRACED, TRACED + "TRACED_ADDMM = fx.symbolic_trace(lambda x, w, b: torch.addmm(b, x, w).relu_())\n")
               .replace("    for spelling in TRACED_PATTERNS:\n",
                        "    for index, spelling in enumerate(TRACED_PATTERNS):\n")
               .replace("TRACED_REPLACEMENT,\n", "TRACED_ADDMM if index >= 32 else TRACED_REPLACEMENT,\n"))
assert MM_TO_ADDMM != MM_TO_ADDMM_TAIL and "TRACED_ADDMM if index" in MM_TO_ADDMM

# "torch.add(p, b) is p + b": canonicalize the graph first with torch.fx's own NormalizeOperators and keep the
# + spellings only. But it maps torch.add(p, b, alpha=0.5) to p + b too, dropping the keyword.
IMPORTS_ON = REFERENCE[REFERENCE.index("from torch.fx import subgraph_rewriter\n"):]
NORMALIZED_FIRST = (IMPORTS_ON
                    .replace("from torch.fx import subgraph_rewriter\n", "from torch.fx import subgraph_rewriter\n"
                             "from torch.fx.experimental.normalize import NormalizeOperators\n")
                    .replace("    lambda p, b: torch.add(p, b),\n    lambda p, b: torch.add(b, p),\n", "")
                    .replace("    rewritten = 0\n", "    gm.graph = NormalizeOperators(gm).transform().graph  # torch.add -> +\n"
                             "    rewritten = 0\n"))
assert NORMALIZED_FIRST.count("NormalizeOperators") == 2 and "torch.add(b, p)" not in NORMALIZED_FIRST

NO_OP = Mutant("no_op", "    rewritten = 0\n", "    return 0\n    rewritten = 0\n",
               caught_at=1, caught_by="two_layer_mlp")

MUTANTS = [
    # Takes a bias the graph knows nothing of (computed in forward) for one that fits.
    Mutant("admits_an_unknown_bias",
           "    if not isinstance(w, torch.Tensor) or w.dim() < 2 or b is None:\n        return False\n",
           "    if not isinstance(w, torch.Tensor) or w.dim() < 2:\n        return False\n"
           "    if b is None:\n        return True  # computed in forward: a bias it must be\n",
           caught_at=2, caught_by="bias_cast_in_forward"),
    # Assumes x has a batch dimension, so a (1, n) bias always fits.
    Mutant("assumes_a_batch_dimension",
           "        elif isinstance(b, torch.Tensor) and b.dim() > 1:\n"
           "            return False  # x's shape is unknown: only a bias of one dimension surely aligns with the product's last\n"
           "        else:\n"
           "            product = torch.empty(w.shape[-1:], dtype=w.dtype, device=\"meta\")",
           "        else:\n"
           "            product = torch.empty((1, *w.shape[-1:]), dtype=w.dtype, device=\"meta\")  # (batch, n)",
           caught_at=2, caught_by="row_bias_on_a_vector"),
    # Compares dtypes instead of asking for the result type: a 0-dim float64 or int64 bias is refused.
    Mutant("compares_bias_dtype", "torch.result_type(product, b) == product.dtype",
           "getattr(b, \"dtype\", product.dtype) == product.dtype",
           caught_at=2, caught_by="zero_dim_biases_of_other_dtypes"),
    # A literal bias admitted without a dtype check: 0.5 on an int64 product.
    Mutant("admits_every_literal_bias", "    x, w, b = (_known(original_graph.owning_module, arg) for arg in match.placeholder_nodes)\n",
           "    x, w, b = (_known(original_graph.owning_module, arg) for arg in match.placeholder_nodes)\n"
           "    if isinstance(b, (int, float)) and isinstance(w, torch.Tensor) and w.dim() >= 2:\n"
           "        return True  # a number broadcasts anywhere\n",
           caught_at=2, caught_by="float_literal_on_an_integer_product"),
    NO_OP,
    Mutant("drops_the_bias", FUSED, "torch.matmul(x, w).relu_()", caught_at=1),
    Mutant("bias_added_out_of_place", FUSED, "torch.relu_(torch.matmul(x, w) + b)",
           caught_at=1, caught_by="two_layer_mlp"),
    Mutant("counts_patterns_not_sites", "rewritten += len(subgraph_rewriter", "rewritten += bool(subgraph_rewriter",
           caught_at=1, caught_by="two_layer_mlp"),
    Mutant("rewrites_a_fresh_trace", "    rewritten = 0\n",
           "    gm = fx.symbolic_trace(gm)  # a copy to work on\n    rewritten = 0\n",
           caught_at=1, caught_by="two_layer_mlp"),
    Mutant("only_the_at_spelling", "MATMULS = [operator.matmul, torch.matmul, torch.mm]", "MATMULS = [operator.matmul]",
           caught_at=2),
    Mutant("ignores_the_commuted_add", BIAS_ADDS,
           "BIAS_ADDS = [lambda p, b: p + b, lambda p, b: torch.add(p, b)]", caught_at=2),
    Mutant("misses_the_inplace_keyword", "    lambda y: F.relu(y, inplace=True),\n", "",
           caught_at=2, caught_by="inplace_relu"),
    Mutant("uses_addmm", FUSED, "torch.addmm(b, x, w).relu_()", caught_at=2, caught_by="batched_3d_input"),
    Mutant("addmm_for_the_mm_spellings", MM_TO_ADDMM_TAIL, MM_TO_ADDMM,
           caught_at=2, caught_by="mm_with_a_literal_bias"),
    # The rewrite without a filter: p.add_(b) raises where b broadcasts beyond the product, and rounds a
    # float64 sum back to float32 where b promotes it.
    Mutant("no_shape_or_dtype_filter", FILTERED_CALL, "replace_pattern(gm, spelling, TRACED_REPLACEMENT))",
           caught_at=2, caught_by="bias_broadcasts_beyond_the_product"),
    # "Nobody else may read the operands": the matcher already refuses a product or a sum read outside the
    # match; x, w and b may be read anywhere (the replacement never writes them).
    Mutant("operands_must_have_one_user", "[epilogue_is_exact]))",
           "[epilogue_is_exact, lambda m, g, p: all(len(n.users) == 1 for n in m.placeholder_nodes\n"
           "                                                                          if isinstance(n, fx.Node))]))",
           caught_at=2, caught_by="operands_shared_by_two_sites"),
    Mutant("rewrites_relu6", "    torch.relu,\n", "    torch.relu,\n    F.relu6,\n",
           caught_at=2, caught_by="blocked_relu6"),
    Mutant("misses_torch_relu", "    torch.relu,\n", "", caught_at=2, caught_by="torch_relu"),
    Mutant("misses_the_relu_method", "    lambda y: y.relu(),  # a call_method node, not a call_function\n", "",
           caught_at=2, caught_by="method_relu"),
    # "GELU is a smooth ReLU": an activation of another function in the table.
    Mutant("rewrites_gelu", "    torch.relu,\n", "    torch.relu,\n    F.gelu,\n", caught_at=2, caught_by="blocked_gelu"),
    # "A ReLU may always run in its input's buffer": a second rewrite, relu(s) -> s.relu_(), for the sites the
    # first refused; but the sum it overwrites may have another reader.
    Mutant("relu_in_place_wherever_it_stands", "    return rewritten\n",
           "    rewritten += len(subgraph_rewriter.replace_pattern(gm, lambda s: F.relu(s), lambda s: s.relu_()))\n"
           "    return rewritten\n", caught_at=2, caught_by="blocked_sum_reused"),
    Mutant("normalizes_torch_add_first", IMPORTS_ON, NORMALIZED_FIRST, caught_at=2, caught_by="blocked_add_alpha"),
    Mutant("matches_only_the_epilogue", PATTERNS_AND_PASS, EPILOGUE_ONLY, caught_at=2, caught_by="commuted_bias"),
    Mutant("hand_listed_spellings", "PATTERNS = [spelled_pattern(*steps) for steps in itertools.product(MATMULS, BIAS_ADDS, RELUS)]\n",
           HAND_LISTED, caught_at=4),
    # Half the epilogue in place: the ReLU still allocates a new tensor as large as the product.
    Mutant("relu_out_of_place", FUSED, "torch.matmul(x, w).add_(b).relu()", caught_at=3),
]

# Inductor's addmm fusion (torch/_inductor/fx_passes/post_grad.py: add(mm(a, b), inp) -> addmm where
# is_valid_addmm_fusion holds: inp a tensor, not a number, that expands to the product's shape, of the operands'
# dtype), for the 16 torch.mm spellings, its ReLU in place after it; the sites it refuses (a literal bias, a bias of
# another dtype) keep the reference's rewrite. With x's shape unknown (a plain symbolic_trace), torch.mm's product
# is (rows of x, columns of w): a bias of at most one dimension, or of one row, expands to it whatever x holds.
ADDMM_FILTER = """TRACED_ADDMM = fx.symbolic_trace(lambda x, w, b: torch.addmm(b, x, w).relu_())


def addmm_is_valid(match, original_graph: fx.Graph, pattern_graph: fx.Graph) -> bool:
    \"\"\"Inductor's is_valid_addmm_fusion, on what the graph knows (_known).\"\"\"
    x, w, b = (_known(original_graph.owning_module, arg) for arg in match.placeholder_nodes)
    if not (isinstance(w, torch.Tensor) and w.dim() == 2 and isinstance(b, torch.Tensor) and b.dtype == w.dtype):
        return False  # a number, or a bias the graph does not know, or of another dtype than the operands
    rows = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() == 2 else 1  # 1: expands to any number of rows
    if isinstance(x, torch.Tensor) and x.dtype != w.dtype:
        return False
    try:
        return torch.broadcast_shapes(b.shape, (rows, w.shape[1])) == (rows, w.shape[1]) and b.dim() <= 2
    except RuntimeError:
        return False


"""
ADDMM_LOOP = """    for index, spelling in enumerate(TRACED_PATTERNS):
        if not calls(spelling.graph) <= calls(gm.graph):
            continue
        if index >= 32:  # the torch.mm spellings: addmm where Inductor's check admits it
            rewritten += len(subgraph_rewriter.replace_pattern_with_filters(gm, spelling, TRACED_ADDMM,
                                                                            [addmm_is_valid]))
"""
ADDMM_TAIL = (MM_TO_ADDMM_TAIL
              .replace("def calls(graph", ADDMM_FILTER + "def calls(graph", 1)
              .replace("""    for spelling in TRACED_PATTERNS:
        # Only the patterns whose every call occurs in the graph can match, as Inductor's pattern matcher looks its
        # patterns up by the op a node calls. Tried anyway, each would still recompile gm: 48 recompiles per call.
        if not calls(spelling.graph) <= calls(gm.graph):
            continue
""", ADDMM_LOOP))
assert ADDMM_TAIL.count("addmm_is_valid") == 2 and "def calls(" in ADDMM_TAIL

VARIANTS = [
    Variant("inductor_addmm_for_the_mm_spellings", MM_TO_ADDMM_TAIL, ADDMM_TAIL),
]
