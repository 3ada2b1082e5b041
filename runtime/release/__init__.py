"""The release of the disaggregated path: its state machine, record and rollback order
(docs/design.md, The release). machine.py and record.py are pure logic; wire.py maps them to
pd.v1 protos."""
