"""The raw prompts the decode and service benchmarks share (same text, same token budgets)."""

PROMPTS = [
    "Once upon a time, in a small village by the sea,",
    "The three most important inventions in history are",
    "Here is a short recipe for pancakes:",
    "The planets of the solar system, in order, are",
    "A good way to start learning to program is",
    "The history of the bicycle begins",
    "My favourite thing about autumn is",
    "In the year 2050, cities will",
]
