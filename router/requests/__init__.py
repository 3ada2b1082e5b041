"""The router's request wing: admission, the admission queue, the planner (the
mode's route for attempt 1, priced by router/pricing), attempts and their
teardown, the retry policy, the cluster view and in-flight overlay, the
hand-off manifest, the stream book, the output log and the decision log."""
