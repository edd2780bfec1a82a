package registry

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
)

// Instance credentials.
//
// On one host every instance of a service shares an address, so the
// address proof (HoldsAddress) tells a host, not an instance: a sibling
// process there could deregister its neighbour as if it were the
// neighbour, or report it unready as its own self-report. An instance a
// workload registers therefore gets a credential: 256 random bits, handed
// out once in the registration response and kept by muster only as its
// SHA-256 (the secret is high-entropy, so a slow KDF would buy nothing).
// The instance presents it in the CredentialHeader of its renewals, its
// own deregistration and its self-reports; it is compared in constant
// time and never logged or audited.
//
// Instances with no credential (reconciled ones, endpoints declared by an
// operator, rows from before migration 000020) keep the address proof
// alone, as before.

// CredentialHeader is the HTTP header an instance presents its credential
// in.
const CredentialHeader = "Muster-Instance-Credential"

// credentialBytes is the credential's entropy: 256 bits.
const credentialBytes = 32

// Credential is a credential as a caller presented it, held only as its
// SHA-256 so that the secret itself goes no further than the handler that
// read it. The zero Credential is none presented.
type Credential struct {
	sum *[sha256.Size]byte
}

// PresentedCredential returns the credential a caller presented as
// secret; an empty secret is none presented.
func PresentedCredential(secret string) Credential {
	if secret == "" {
		return Credential{}
	}
	sum := sha256.Sum256([]byte(secret))
	return Credential{sum: &sum}
}

// Present reports whether a credential was presented at all.
func (c Credential) Present() bool { return c.sum != nil }

// String never shows the credential.
func (c Credential) String() string {
	if c.sum == nil {
		return "none"
	}
	return "[presented]"
}

// CredentialHash is the hash of an instance's credential as the registry
// holds it; the zero CredentialHash is an instance with no credential.
type CredentialHash struct {
	sum *[sha256.Size]byte
}

func credentialHashOf(b []byte) CredentialHash {
	if len(b) != sha256.Size {
		return CredentialHash{}
	}
	var sum [sha256.Size]byte
	copy(sum[:], b)
	return CredentialHash{sum: &sum}
}

// Set reports whether the instance has a credential.
func (h CredentialHash) Set() bool { return h.sum != nil }

// Matches reports whether c is the instance's credential, in constant
// time. An instance with no credential matches nothing.
func (h CredentialHash) Matches(c Credential) bool {
	if h.sum == nil || c.sum == nil {
		return false
	}
	return subtle.ConstantTimeCompare(h.sum[:], c.sum[:]) == 1
}

// newCredential returns a fresh credential and the hash to store.
func newCredential() (secret string, hash []byte, err error) {
	b := make([]byte, credentialBytes)
	if _, err := rand.Read(b); err != nil {
		return "", nil, fmt.Errorf("new instance credential: %w", err)
	}
	secret = base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(secret))
	return secret, sum[:], nil
}

// CredentialCheck is how a caller's credential stands against an
// instance's.
type CredentialCheck int

// The outcomes of CheckCredential.
const (
	// CredentialNotNeeded: the instance has no credential; the address
	// proof alone speaks for it.
	CredentialNotNeeded CredentialCheck = iota
	// CredentialMatches: the caller presented the instance's credential.
	CredentialMatches
	// CredentialMissing: the instance has one and the caller presented
	// none.
	CredentialMissing
	// CredentialWrong: the caller presented a credential that is not the
	// instance's (a sibling's, say).
	CredentialWrong
)

// Check compares c with the instance's credential.
func (h CredentialHash) Check(c Credential) CredentialCheck {
	switch {
	case !h.Set():
		return CredentialNotNeeded
	case !c.Present():
		return CredentialMissing
	case h.Matches(c):
		return CredentialMatches
	default:
		return CredentialWrong
	}
}

// CredentialHash is the hash of the instance's credential (unset when it has
// none).
func (in Instance) CredentialHash() CredentialHash { return in.credential }
