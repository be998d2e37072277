package queuebox

import (
	"math/rand"
	"time"
)

// FailureAction is a retry policy's answer for a failed message:
// RetryAfter(d) or DeadLetter().
type FailureAction struct {
	dead  bool
	delay time.Duration
}

// RetryAfter gives the message back for another attempt, due after d
// (a negative d is 0); its attempt goes up by one.
func RetryAfter(d time.Duration) FailureAction {
	if d < 0 {
		d = 0
	}
	return FailureAction{delay: d}
}

// DeadLetter moves the message to dead: no worker claims it again until an
// operator requeues it.
func DeadLetter() FailureAction {
	return FailureAction{dead: true}
}

// Dead reports whether the action is a dead letter.
func (a FailureAction) Dead() bool { return a.dead }

// Delay is the retry's delay (0 for a dead letter).
func (a FailureAction) Delay() time.Duration { return a.delay }

// RetryPolicy decides what a failure does.  The message carries Attempt
// (the attempts before this one); failure is what the handler returned.
type RetryPolicy interface {
	Decide(message Message, failure error) FailureAction
}

// RetryPolicyFunc makes a function a RetryPolicy.
type RetryPolicyFunc func(message Message, failure error) FailureAction

// Decide calls f.
func (f RetryPolicyFunc) Decide(message Message, failure error) FailureAction {
	return f(message, failure)
}

// DefaultRetryPolicy retries with an exponential backoff from 1 s
// (1 s × 2^attempt, at most 5 minutes) with ±20 % jitter, and moves the
// message to dead on its fifth attempt.
var DefaultRetryPolicy RetryPolicy = RetryPolicyFunc(defaultDecide)

func defaultDecide(message Message, _ error) FailureAction {
	if message.Attempt+1 >= 5 {
		return DeadLetter()
	}
	base := time.Second
	for i := 0; i < message.Attempt && base < 5*time.Minute; i++ {
		base *= 2
	}
	if base > 5*time.Minute {
		base = 5 * time.Minute
	}
	// ±20 %: a burst of failures does not come back as one burst
	jitter := 0.8 + 0.4*rand.Float64()
	return RetryAfter(time.Duration(float64(base) * jitter))
}
