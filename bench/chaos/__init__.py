"""The nemesis harness of ``python -m bench chaos`` and the soak of ``python -m bench soak``:
Kafka brokers and member processes it can kill, pause, cut off and restart (harness.py), the
seeded nemesis choosing the faults (nemesis.py), and the exactly-once check of the output
(checker.py)."""
