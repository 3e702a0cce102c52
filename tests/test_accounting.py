"""explorer.solvers.accounting: the fixed bytes of each backward moment, as simulate counts
them, for what the tests of whole random steps cannot reach."""

from __future__ import annotations

from explorer.graph import BACKWARD, PLACEHOLDER, ROLE_TANGENT, Graph, Node, TensorMeta
from explorer.solvers.accounting import step_facts


def _meta(nbytes: int, alias: int | None = None) -> TensorMeta:
    fresh = 0 if alias is not None else nbytes
    return TensorMeta((max(nbytes // 4, 1),), "torch.float32", fresh, alias)


def test_a_handed_tangent_lives_until_the_last_reader_of_a_view_of_it():
    # catches: a tangent a loss hands the backward freed after its own last reader while a
    # view of it is read later (sample:gpt's logits gradient, viewed for its last matmuls):
    # the MILP and the floor would then count 64 bytes too few at b
    tangent = Node("tangent", PLACEHOLDER, PLACEHOLDER, [], [_meta(64)], ROLE_TANGENT)
    nodes = [
        tangent,
        Node("v", "aten.view.default", BACKWARD, [("tangent", 0)], [_meta(0, alias=0)]),
        Node("a", "aten.mul.Tensor", BACKWARD, [("tangent", 0)], [_meta(8)]),
        Node("b", "aten.mul.Tensor", BACKWARD, [("v", 0)], [_meta(8)]),
        Node("c", "aten.mul.Tensor", BACKWARD, [("b", 0)], [_meta(8)]),
    ]
    graph = Graph(nodes, model_outputs=[], input_grads=[])
    order = ["v", "a", "b", "c"]
    handed = step_facts(graph, order, handed_tangents=frozenset({"tangent"}))
    assert handed.backward_at == [64, 72, 72, 16]
    assert handed.backward_before == [64, 64, 64, 8]
    held = step_facts(graph, order)  # a user's tangent: through the whole backward
    assert held.backward_at == [64, 72, 72, 80]
