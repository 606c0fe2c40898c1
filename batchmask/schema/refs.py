"""$ref: the schema a reference names, and a reference written together with the keywords beside it.

`resolve` reads a local reference: a JSON pointer into the root document (`#/$defs/a`, percent-decoded) or a
plain-name anchor (`#a`: a subschema's `$anchor` or `$dynamicAnchor`). A reference outside the document is
refused (lenient mode: any JSON value, noted). Recursion is unrolled: a $ref expands at most
SchemaOptions.ref_depth times inside itself (the walk's context counts them). Keywords beside a $ref are a
conjunction (draft 2020-12): the target and the siblings are merged into one schema (schema/siblings.py `merge`)
where that is exact; where it is not, lenient mode writes the $ref alone and notes the siblings left out.
An allOf branch that is only a $ref is replaced by its target first (`inline_refs`), so that allOf can merge.
"""
from __future__ import annotations

from dataclasses import replace

from ..grammar.nodes import Node
from .base import Ctx, Empty, is_annotation
from .base import ptr as jp
from .drafts import pointer_target
from .siblings import merge, redundant


def ref_node(schema: dict, ptr: str, ctx: Ctx) -> Node:
    ref = schema["$ref"]
    rptr = jp(ptr, "$ref")
    target = resolve(ref, rptr, ctx)
    if ctx.refs.count(ref) >= ctx.options.ref_depth:
        raise Empty(rptr, f"recursive $ref {ref!r} unrolled ref_depth={ctx.options.ref_depth} times "
                           "without reaching a value that does not recurse")
    where = ref if isinstance(ref, str) and ref.startswith("#/") else rptr
    return ctx.build(target, where, replace(ctx, refs=ctx.refs + (ref,)))


def resolve(ref, rptr: str, ctx: Ctx):
    """The schema a $ref names: a JSON pointer into the root (#/...), or a plain-name anchor ($anchor,
    $dynamicAnchor). A reference outside the document is refused (lenient mode: any JSON value)."""
    if not isinstance(ref, str):
        ctx.fail(rptr, f"'$ref' must be a string, got {ref!r}")
    if not ref.startswith("#"):
        ctx.relax(rptr, "$ref", f"only local $refs (#/...) are supported, got {ref!r}")
        return True
    node = ctx.root
    if ref in ("#", "#/"):
        return node
    if not ref.startswith("#/"):
        found = anchor_target(ctx.root, ref[1:])
        if found is None:
            ctx.fail(rptr, f"$ref {ref!r}: no $anchor {ref[1:]!r} in the document")
        return found
    node = pointer_target(ctx.root, ref)
    if node is None:
        ctx.fail(rptr, f"$ref {ref!r} points at nothing")
    return node


def anchor_target(root, name: str):
    """The subschema whose $anchor (or $dynamicAnchor) is `name` in the root's own resource: subschemas with an
    `$id` of their own are other resources, whose anchors a plain `#name` does not reach. None if there is none."""
    stack = [root]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            if n is not root and isinstance(n.get("$id"), str):
                continue
            if name in (n.get("$anchor"), n.get("$dynamicAnchor")):
                return n
            stack.extend(reversed([v for k, v in n.items() if k not in ("enum", "const", "default", "examples")]))
        elif isinstance(n, list):
            stack.extend(reversed(n))
    return None


def reachable_refs(schema, ctx: Ctx) -> frozenset:
    """The $ref strings a build of `schema` may expand: those written in it and, transitively, in their targets
    (local ones, found as `resolve` finds them but without its notes and errors). Memoised per object for the
    walk (in ctx.built, keyed apart from the nodes), each object's own $refs found once."""
    memo = ctx.built.setdefault(("reach",), {})
    got = memo.get(id(schema))
    if got is not None:
        return got[1]
    seen, todo = set(), list(_own_refs(schema, memo))
    while todo:
        r = todo.pop()
        if r not in seen:
            seen.add(r)
            target = _local_target(r, ctx.root)
            if target is not None:
                todo.extend(_own_refs(target, memo))
    out = frozenset(seen)
    memo[id(schema)] = (schema, out)
    return out


def _own_refs(node, memo: dict) -> frozenset:
    """The $ref strings written anywhere in `node` (not inside enum/const/default/examples), memoised per object."""
    key = ("own", id(node))
    got = memo.get(key)
    if got is not None:
        return got[1]
    refs = set()
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            refs.add(node["$ref"])
        for k, v in node.items():
            if k not in ("enum", "const", "default", "examples") and isinstance(v, (dict, list)):
                refs |= _own_refs(v, memo)
    elif isinstance(node, list):
        for v in node:
            if isinstance(v, (dict, list)):
                refs |= _own_refs(v, memo)
    out = frozenset(refs)
    memo[key] = (node, out)
    return out


def _local_target(ref: str, root):
    """The subschema a local $ref names (refs.resolve's reading), or None (not local, or naming nothing)."""
    if ref in ("#", "#/"):
        return root
    if ref.startswith("#/"):
        return pointer_target(root, ref)
    if ref.startswith("#"):
        return anchor_target(root, ref[1:])
    return None


def ref_with_siblings(schema: dict, others: list, ptr: str, ctx: Ctx) -> Node:
    """A $ref and keywords beside it: a conjunction, written as the target and the siblings merged in one schema
    (schema/siblings.py); where they cannot be merged, lenient mode keeps the $ref alone."""
    ref, rptr = schema["$ref"], jp(ptr, "$ref")
    target = resolve(ref, rptr, ctx)
    siblings = {k: schema[k] for k in others}
    if target is not None and redundant(siblings, target):
        return ref_node(schema, ptr, ctx)                   # the target says them already: the $ref alone
    merged = merge(siblings, target) if target is not None else None
    if merged is False:
        raise Empty(ptr, f"no value meets both $ref {ref!r} and the keywords beside it")
    if merged is not None:
        if ctx.refs.count(ref) >= ctx.options.ref_depth:
            raise Empty(rptr, f"recursive $ref {ref!r} unrolled ref_depth={ctx.options.ref_depth} times")
        return ctx.build(merged, ptr, replace(ctx, refs=ctx.refs + (ref,)))
    ctx.relax(jp(ptr, others[0]), "siblings", f"{others[0]!r} beside '$ref' is not supported "
                                              "(move it into the referenced schema)")
    return ref_node(schema, ptr, ctx)


def inline_refs(schema: dict, ptr: str, ctx: Ctx):
    """`schema` with each allOf branch that is only a $ref (and annotations) replaced by its target, so that the
    branches can merge; the context notes the $refs expanded (their recursion depth)."""
    branches, refs = [], ctx.refs
    for i, b in enumerate(schema["allOf"]):
        ref = b.get("$ref") if isinstance(b, dict) else None
        if isinstance(ref, str) and all(k == "$ref" or is_annotation(k) for k in b):
            if refs.count(ref) >= ctx.options.ref_depth:
                raise Empty(jp(ptr, "allOf", i, "$ref"), f"recursive $ref {ref!r} unrolled "
                                                          f"ref_depth={ctx.options.ref_depth} times")
            b, refs = resolve(ref, jp(ptr, "allOf", i, "$ref"), ctx), refs + (ref,)
        branches.append(b)
    if refs == ctx.refs:
        return schema, ctx
    return {**schema, "allOf": branches}, replace(ctx, refs=refs)
