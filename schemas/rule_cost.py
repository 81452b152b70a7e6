"""The matching work a routing rule set may cost per request, in units: the budget a set is
checked against before it is stored (``rule_language.compile_rules``).

The worst request matches no rule and makes every rule evaluate every condition and
comparison it has. The charge of a set is the sum over its parts of:

- each condition object (a rule's ``when``, each element of an ``$and``/``$or``, ``{}``
  included): :data:`NODE_UNITS`;
- each comparison other than ``$regex``: :data:`COMPARISON_UNITS` (hashing into an ``$in``
  set and comparing strings no longer than ``MAX_LABEL_BYTES`` are within it), plus
  :data:`IN_VALUE_UNITS` per value of an ``$in``/``$nin`` list: not work per request, but
  what building its set costs once per change, which the budget bounds as well;
- each ``$regex``: :data:`REGEX_CALL_UNITS` plus :data:`REGEX_STEP_UNITS` per RE2 program
  instruction per byte of the longest string it can be handed (a label: ``MAX_LABEL_BYTES``;
  a ``params.*`` string, a name the gateway derives: :data:`PARAM_TEXT_BYTES`): RE2's
  fallback engine visits each instruction at most once per input byte, so its time is linear
  in both, whatever the pattern and the label;

times the most elements a list-valued field holds (``params.modalities``). A unit is at most
about a nanosecond on the reference machine (2 shared cores) for the costliest set of each
kind (``tests/fixtures/rule_sets.py``), which ``tests/benchmarks/rules_cost.py`` times: the
interpreter-bound kinds cost the most per unit, the heaviest regexes about two thirds of that
(RE2 runs no DFA, see ``rule_language``), small regexes and ``$in`` lists far less. Under
callgrind the costliest kinds take 4.6 to 7.3 instructions per unit; a condition object is
charged 150 (at 100 it took 9.7 once a comparison became one closure call). The budget
``MAX_RULE_SET_UNITS`` (300,000) holds the worst admissible set to about a quarter of a
millisecond per request at the median, so its 99th percentile stays under 0.7 ms on a noisy
machine: under the issue's millisecond with margin. A single ``$regex`` at
``MAX_REGEX_PROGRAM`` on a label (2,000 + 12 x 192 x 128 = 296,912) still fits.
"""

from __future__ import annotations

from schemas.rules import MAX_LABEL_BYTES

NODE_UNITS = 150
COMPARISON_UNITS = 200
IN_VALUE_UNITS = 25
REGEX_CALL_UNITS = 2_000
REGEX_STEP_UNITS = 12
# The most elements a list-valued field holds: "text" plus image, audio and file.
LIST_ELEMENTS = {"params.modalities": 4}
# The longest string a ``params.*`` field holds (surface, role, modality names).
PARAM_TEXT_BYTES = 16


def comparison_units(field: str, values: int = 0) -> int:
    """The charge of one comparison other than ``$regex`` on ``field``; ``values``: the
    length of an ``$in``/``$nin`` list."""
    return COMPARISON_UNITS * LIST_ELEMENTS.get(field, 1) + IN_VALUE_UNITS * values


def regex_units(field: str, program_size: int) -> int:
    """The charge of one ``$regex`` on ``field`` whose RE2 program has ``program_size``
    instructions."""
    text = PARAM_TEXT_BYTES if field.startswith("params.") else MAX_LABEL_BYTES
    search = REGEX_CALL_UNITS + REGEX_STEP_UNITS * program_size * text
    return search * LIST_ELEMENTS.get(field, 1)
