"""The router's edge: what a client's request meets before the orchestrator.

`intake` reads a Generate request's wire bytes (`wire`) and checks what needs only
sizes before the message is parsed, under the intake budget (`budget`); `refusal`
is how a refusal, and any message quoting the client's input, stays bounded.
"""
