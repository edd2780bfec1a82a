package identity

import (
	"net/http"
	"time"
)

// NewVerifierWithClock exposes the clock injection to the external tests.
func NewVerifierWithClock(issuers []IssuerConfig, client *http.Client, now func() time.Time) (*Verifier, error) {
	return newVerifier(issuers, client, now)
}
