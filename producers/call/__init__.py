"""One generating call, from the harness's request to its answer: ``generation`` (the handler),
``dispatch`` (the engine leg under deadlines, and the evidence of each way it fails), ``stream`` (a
streamed call: chunks reach the client as they come, the capture comes last).
"""
