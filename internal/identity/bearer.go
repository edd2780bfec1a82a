package identity

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// BearerToken returns the token of r's "Authorization: Bearer <token>"
// header; the scheme is matched case-insensitively (RFC 9110 §11.1).
//
// A missing header, another scheme or an empty token wrap ErrNoToken. More
// than one Authorization header, or a token outside the RFC 6750 token68
// alphabet, wrap ErrInvalidToken. Errors never contain the header's value.
func BearerToken(r *http.Request) (string, error) {
	values := r.Header.Values("Authorization")
	switch len(values) {
	case 0:
		return "", fmt.Errorf("no Authorization header: %w", ErrNoToken)
	case 1:
	default:
		return "", invalidAs(FailureMalformed, "more than one Authorization header")
	}
	scheme, token, _ := strings.Cut(strings.TrimSpace(values[0]), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", fmt.Errorf("authorization scheme is not Bearer: %w", ErrNoToken)
	}
	token = strings.TrimLeft(token, " ")
	if token == "" {
		return "", fmt.Errorf("empty bearer token: %w", ErrNoToken)
	}
	if err := checkToken68(token); err != nil {
		return "", invalidAs(FailureMalformed, err.Error())
	}
	return token, nil
}

// checkToken68 checks the RFC 6750 b64token syntax:
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func checkToken68(s string) error {
	i := 0
	for ; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/') {
			break
		}
	}
	if i == 0 {
		return errors.New("malformed bearer token")
	}
	for ; i < len(s); i++ {
		if s[i] != '=' {
			return errors.New("malformed bearer token")
		}
	}
	return nil
}
