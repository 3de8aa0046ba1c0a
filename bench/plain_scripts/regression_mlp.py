# ruff: noqa  (written as its public original is, not to this project's style)
"""A regression MLP as the popular "Building a Regression Model in PyTorch" tutorial
(machinelearningmastery.com) writes it: module-level settings, California housing's 8 features,
``nn.Sequential``, ``loss_fn = nn.MSELoss()``, Adam, batches sliced by hand from the training
tensors (no DataLoader), ``n_epochs = 100``, ``batch_size = 10``. The data is random, of the
dataset's shape (sklearn's fetch_california_housing is not made); its tqdm bar is left out."""
import copy

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

# Read data (fetch_california_housing(), made up at its shape: 20640 x 8)
X = np.random.rand(2064, 8).astype(np.float32)
y = np.random.rand(2064).astype(np.float32)

# train-test split for model evaluation
split = int(0.7 * len(X))
X_train, X_test, y_train, y_test = X[:split], X[split:], y[:split], y[split:]

# Convert to 2D PyTorch tensors
X_train = torch.tensor(X_train, dtype=torch.float32)
y_train = torch.tensor(y_train, dtype=torch.float32).reshape(-1, 1)
X_test = torch.tensor(X_test, dtype=torch.float32)
y_test = torch.tensor(y_test, dtype=torch.float32).reshape(-1, 1)

# Define the model
model = nn.Sequential(
    nn.Linear(8, 24),
    nn.ReLU(),
    nn.Linear(24, 12),
    nn.ReLU(),
    nn.Linear(12, 6),
    nn.ReLU(),
    nn.Linear(6, 1)
)

# loss function and optimizer
loss_fn = nn.MSELoss()  # mean square error
optimizer = optim.Adam(model.parameters(), lr=0.0001)

n_epochs = 100   # number of epochs to run
batch_size = 10  # size of each batch
batch_start = torch.arange(0, len(X_train), batch_size)

# Hold the best model
best_mse = np.inf   # init to infinity
best_weights = None
history = []

for epoch in range(n_epochs):
    model.train()
    for start in batch_start:
        # take a batch
        X_batch = X_train[start:start+batch_size]
        y_batch = y_train[start:start+batch_size]
        # forward pass
        y_pred = model(X_batch)
        loss = loss_fn(y_pred, y_batch)
        # backward pass
        optimizer.zero_grad()
        loss.backward()
        # update weights
        optimizer.step()
    # evaluate accuracy at end of each epoch
    model.eval()
    y_pred = model(X_test)
    mse = loss_fn(y_pred, y_test)
    mse = float(mse)
    history.append(mse)
    if mse < best_mse:
        best_mse = mse
        best_weights = copy.deepcopy(model.state_dict())

# restore model and return best accuracy
model.load_state_dict(best_weights)
print("MSE: %.2f" % best_mse)
