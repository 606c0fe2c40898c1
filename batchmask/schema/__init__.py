"""The JSON Schema front end: a schema in, the grammar node tree of every JSON value it allows out.

In: a JSON Schema (a dict or bool) and SchemaOptions. Out: a grammar node tree (batchmask.grammar), serialised
compactly; or a SchemaError naming the keyword and the JSON pointer. Uses batchmask.grammar and, to validate,
the jsonschema library.

    build.py        the walk: $ref, anyOf/oneOf/allOf, enum/const; the entry `schema_node`, `canonical_schema`
    base.py         keyword sets (supported, refused, annotations), SchemaOptions (the caps), the walk's context
    siblings.py     keywords beside anyOf/oneOf moved into each branch, where that is exact
    types.py        one builder per JSON type (string, integer, number, boolean, null, array, object)
    objects.py      objects: properties, patternProperties, maps, propertyNames, min/maxProperties, dependentRequired
    overlap.py      whether two key languages are disjoint (patternProperties)
    numbers.py      exact integer and number ranges as digit automata
    strings.py      JSON characters from a set of code points, and `format`s
    formats_net.py  ipv4, hostname, email, uri
    regex.py        the `pattern` subset
    regex_classes.py  the class escapes (digits, word, space, and their complements) as both readings match them
    json_values.py  JSON equality, literals, types, oneOf disjointness
    nodes.py        small node builders over batchmask.grammar, `lex_range`, `node_accepts`
    drafts.py       drafts 4-7 spellings -> 2020-12; batchmask's closed objects written as JSON Schema
    validate.py     a value against a schema, by the jsonschema library (the free arm, parsed calls, lenient values)

Public names: batchmask.schema.build.{schema_node, canonical_schema}, batchmask.schema.base.SchemaOptions,
batchmask.errors.SchemaError (also `from batchmask import SchemaOptions, SchemaError`).
"""
