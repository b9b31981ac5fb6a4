package envtest

import (
	"net/http"
	"slices"
	"sync"
	"time"
)

// RequestCounter counts, at a client's transport (rest.Config.Wrap(c.Wrap)), the requests by method
// and path, and those answered 404 Not Found. A request is counted when its response is back, which
// may be after the test sees its effect: wait for a count (Eventually) before checking that nothing
// more is sent.
type RequestCounter struct {
	mu               sync.Mutex
	counts, notFound map[string]int
	// answered is when each request's response came back, by method and path.
	answered map[string][]time.Time
}

// NewRequestCounter returns a counter with nothing counted.
func NewRequestCounter() *RequestCounter {
	return &RequestCounter{counts: map[string]int{}, notFound: map[string]int{}, answered: map[string][]time.Time{}}
}

// Wrap is a rest.Config WrapTransport that counts every request.
func (c *RequestCounter) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		key := req.Method + " " + req.URL.Path
		c.mu.Lock()
		defer c.mu.Unlock()
		c.counts[key]++
		c.answered[key] = append(c.answered[key], time.Now())
		if err == nil && resp.StatusCode == http.StatusNotFound {
			c.notFound[key]++
		}
		return resp, err
	})
}

// Of returns how many requests of the method were sent to the path.
func (c *RequestCounter) Of(method, path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[method+" "+path]
}

// AnsweredAt returns when the responses to the requests of the method to the path came back, oldest
// first.
func (c *RequestCounter) AnsweredAt(method, path string) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.answered[method+" "+path])
}

// WritesTo returns how many writes (PATCH or PUT) were sent to the object at path and to its status.
func (c *RequestCounter) WritesTo(path string) int {
	n := 0
	for _, method := range []string{http.MethodPatch, http.MethodPut} {
		n += c.Of(method, path) + c.Of(method, path+"/status")
	}
	return n
}

// ReadsOf returns how many GETs were sent to the object at path (live reads: a cache lists and
// watches).
func (c *RequestCounter) ReadsOf(path string) int {
	return c.Of(http.MethodGet, path)
}

// NotFoundOf returns how many requests of the method to the path were answered 404.
func (c *RequestCounter) NotFoundOf(method, path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.notFound[method+" "+path]
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
