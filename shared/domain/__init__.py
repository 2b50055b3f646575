"""The sandbox domain: the record, its states, the one transition table and the time rules.

Pure (stdlib and pydantic; no bus, runtime or clock other than ``now``): every service reads its
rules from here, so a new lifecycle rule is written once, in this package.

- ``states``: the states and the named predicates the api, proxy, scheduler and scaler ask;
- ``record``: the KV record (one per sandbox) and its parts;
- ``transitions``: the transition table and the record mutations that read it;
- ``timing``: the deadline and retention rules.
"""
