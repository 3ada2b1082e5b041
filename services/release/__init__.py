"""The release of the disaggregated path: its state machine, record and rollback order
(article 0x0FF-0x0FG). machine.py and record.py are pure logic; wire.py maps them to
pd.v1 protos."""
