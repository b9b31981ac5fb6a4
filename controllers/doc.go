// Package controllers wires CAPR's controllers into a controller-runtime manager: the health checker
// (controllers/machinehealthcheck) and the controllers that drive remediations. main.go, the envtest
// suites and the sandbox all set up the same way through SetupWithManager, so what is tested is what
// ships.
package controllers
