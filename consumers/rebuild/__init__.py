"""Pure rebuild: a frozen snapshot in, one token-exact trajectory (or, with
``delivery_mode="traces"``, every labelled trace of the rollout's tree) and a mask decision out.

Imports no framework (checked by ``tests/unit/test_architecture.py``).
"""

from consumers.rebuild.builder import rebuild
from consumers.rebuild.output import to_json_dict, to_json_line
from consumers.rebuild.projection import assert_prefix_contiguity
from consumers.rebuild.rules import RebuildRules
from consumers.rebuild.tree import children, expand_trace, tree_sizes

__all__ = ["RebuildRules", "assert_prefix_contiguity", "children", "expand_trace", "rebuild", "to_json_dict",
           "to_json_line", "tree_sizes"]
