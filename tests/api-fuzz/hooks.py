"""schemathesis checks for Warren's REST API (loaded through SCHEMATHESIS_HOOKS).

`no_internal_error` replaces schemathesis's `not_a_server_error`: a 500 (a bug: the server could not
say whose fault it was) or a 502 fails, while 503 (the host out of addresses or tasks) and 507 (the state
disk's room for sandboxes used up; the fuzzer creates many) are the documented answers of a host at
capacity, which the `status_code_conformance` check holds to the document.
"""

import schemathesis


@schemathesis.check
def no_internal_error(ctx, response, case):
    if response.status_code in (500, 502):
        raise AssertionError(f"{case.method} {case.path} answered {response.status_code}: {response.text[:300]}")
