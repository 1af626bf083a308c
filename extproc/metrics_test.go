package extproc

import "testing"

func TestErrorCodeSpelledAsUpstream(t *testing.T) {
	cases := map[int]string{400: "BadRequest", 413: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
		429: "ResourceExhausted", 500: "Internal", 503: "ServiceUnavailable", 418: "418"}
	for status, want := range cases {
		if got := errorCode(status); got != want {
			t.Errorf("errorCode(%d) = %q, want %q", status, got, want)
		}
	}
}
