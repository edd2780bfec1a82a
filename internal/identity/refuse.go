package identity

// Refusal returns an error wrapping ErrInvalidToken whose FailureCode is
// code and whose text is reason: for an authenticator beside the
// Verifier (internal/breakglass) whose refusals the server must count,
// audit and answer exactly as the Verifier's. reason is shown to the
// caller, so it must hold nothing secret.
func Refusal(code, reason string) error { return invalidAs(code, reason) }
